"""A huge prompt is refused before it is tokenized and stalls nobody; a prompt that is not valid
Unicode is the client's mistake (400), never a 500; long prompts are tokenized off the event
loop."""
from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.engine
MODEL = "tiny-llama-cpu"


def test_longest_token_bounds_every_encoding():
    from forge.engines.transformers.loading import HFTokenizer
    from forge.requests.prompt_bounds import FALLBACK_TOKEN_CHARS, longest_token_chars
    from transformers import AutoTokenizer

    from tests.serve.conftest import REPO

    tok = HFTokenizer(
        AutoTokenizer.from_pretrained(str(REPO / "forge" / "embedded" / "tiny-llama"))
    )
    longest = longest_token_chars(tok)
    assert longest == max(len(k) for k in tok.hf.get_vocab())
    rng = random.Random(7)
    alphabet = "abc xyz  \n\t.,;:!?'\"-_é漢字😀" + "".join(chr(c) for c in range(32, 127))
    words = list(tok.hf.get_vocab())
    for _ in range(300):  # random text, and runs of the longest vocabulary entries (the worst case)
        text = (
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400)))
            if rng.random() < 0.5
            else "".join(rng.choice(words).replace("Ġ", " ") for _ in range(rng.randint(1, 100)))
        )
        assert len(tok.encode(text)) >= len(text) / longest, text
    assert longest_token_chars(object()) == FALLBACK_TOKEN_CHARS


def test_huge_prompt_is_refused_before_tokenizing_and_stalls_nobody(served):
    """20 MB of text: today's main tokenized it on the shared loop (about 1 s per MB on this
    tokenizer)."""
    result = {}

    def big():
        t0 = time.monotonic()
        result["r"] = httpx.post(
            served.url + "/v1/completions",
            timeout=120,
            json={"model": MODEL, "prompt": "hello world " * (20 * 2**20 // 12), "max_tokens": 2},
        )
        result["s"] = time.monotonic() - t0

    thread = threading.Thread(target=big)
    thread.start()
    worst = 0.0
    while thread.is_alive():
        t0 = time.monotonic()
        assert httpx.get(served.url + "/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.02)
    thread.join()
    r = result["r"]
    assert r.status_code == 400 and "refused before tokenizing" in r.json()["error"]["message"], (
        r.text
    )
    assert worst < 3.0, worst  # other clients were answered while it was parsed and refused


def test_invalid_unicode_prompt_is_a_400(served):
    body = b'{"model": "%s", "prompt": "a\\ud800b", "max_tokens": 2}' % MODEL.encode()
    r = httpx.post(
        served.url + "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert (
        r.status_code == 400
        and "not valid Unicode text: a lone surrogate (U+D800) at character 1"
        in r.json()["error"]["message"]
    ), r.text
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}' % MODEL.encode()
    r = httpx.post(
        served.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid Unicode" in r.json()["error"]["message"], r.text
    r = httpx.post(
        served.url + "/v1/generate",
        content=b'{"requests": [{"prompt": "\\ud800", "max_tokens": 2}]}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["results"][0]["error"]["type"] == "RequestRejected", (
        r.text
    )


def test_long_prompts_are_tokenized_off_the_loop(served, monkeypatch):
    import forge.node.local as node_module

    calls = []
    encode = served.node._encode_locally

    def spy(prompt):
        # not the server's event loop
        calls.append(threading.current_thread() is not served._thread)
        return encode(prompt)

    monkeypatch.setattr(node_module, "OFF_LOOP_CHARS", 100)
    monkeypatch.setattr(served.node, "_encode_locally", spy)
    r = httpx.post(
        served.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "Alice was reading. " * 20,
            "max_tokens": 3,
            "temperature": 0,
        },
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 20, r.text
    assert calls == [True]
