"""`stream=True` sends each token's text as the engine makes it (Node.stream: the engine's partial
outputs, carried over the worker link as progress for that request only), on the embedded
transformers node (`local`) and on vLLM's CPU engine (`local-vllm`): real forge serve, real HTTP,
the official openai client; the first content arrives well before the last, the pieces join into the
non-streamed greedy answer (stop strings cut the same), and a client that leaves mid-stream takes
its generation back (the card's in-flight count goes to zero)."""
from __future__ import annotations

import time

import pytest

from tests.serve.conftest import ServedNode, wait_settled

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow         # starts forge serve with a worker process per card

MODEL = "tiny-llama-cpu"
LONG = "1, 2, 3, 4, 5, 6, 7,"         # the tiny model keeps going: the whole budget is generated


@pytest.fixture(scope="module", params=["local", "local-vllm"])
def served(request, tmp_path_factory):
    from forge.embedded import PACKAGED_NODES

    if request.param == "local-vllm":
        pytest.importorskip("vllm")
    s = ServedNode(targets=(), node_path=PACKAGED_NODES[request.param]).start(
        tmp_path_factory.mktemp("srv")
    )
    s.model = s.node.describe()["cards"][0]["tier"]
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def timed_pieces(client, **body) -> list[tuple[float, str]]:
    """(seconds since the request was sent, text) of each content chunk."""
    t0, out = time.monotonic(), []
    for chunk in client.completions.create(stream=True, **body):
        if chunk.choices and chunk.choices[0].text:
            out.append((time.monotonic() - t0, chunk.choices[0].text))
    return out


def test_first_piece_arrives_well_before_the_last(served, client):
    whole = client.completions.create(
        model=served.model, prompt=LONG, max_tokens=128, temperature=0
    )
    assert whole.usage.completion_tokens >= 64, whole.usage  # long enough to see the difference
    pieces = timed_pieces(client, model=served.model, prompt=LONG, max_tokens=128, temperature=0)
    first, last = pieces[0][0], pieces[-1][0]
    print(f"{served.model}: {len(pieces)} pieces, first {first:.3f} s, last {last:.3f} s")
    assert len(pieces) >= 20 and first < 0.5 * last, (len(pieces), first, last)
    assert "".join(p for _, p in pieces) == whole.choices[0].text  # the stream is the greedy answer


def test_chat_stream_is_the_whole_answer(served, client):
    msgs = [{"role": "user", "content": "Count: 1, 2, 3"}]
    whole = client.chat.completions.create(
        model=served.model, messages=msgs, max_tokens=40, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=served.model,
            messages=msgs,
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [whole.choices[0].finish_reason]


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_cut_the_stream_as_the_whole(served, client, include):
    plain = (
        client.completions.create(model=served.model, prompt=LONG, max_tokens=64, temperature=0)
        .choices[0]
        .text
    )
    stop = plain[len(plain) // 2: len(plain) // 2 + 3]  # a string the greedy text reaches midway
    assert stop.strip(), plain
    extra = {"include_stop_str_in_output": include}
    whole = client.completions.create(
        model=served.model, prompt=LONG, max_tokens=64, temperature=0, stop=[stop], extra_body=extra
    )
    chunks = list(
        client.completions.create(
            model=served.model,
            prompt=LONG,
            max_tokens=64,
            temperature=0,
            stop=[stop],
            stream=True,
            extra_body=extra,
        )
    )
    text = "".join(c.choices[0].text for c in chunks)
    assert text == whole.choices[0].text and stop not in text[:-len(stop) or None]
    assert text == plain[:plain.find(stop) + (len(stop) if include else 0)]
    assert (
        chunks[-1].choices[0].finish_reason == "stop" and whole.choices[0].finish_reason == "stop"
    )


def test_guided_stream_comes_whole_once_checked(served, client):
    got = list(
        client.completions.create(
            model=served.model,
            prompt="Pick:",
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"guided_choice": ["alpha", "beta"]},
        )
    )
    assert "".join(c.choices[0].text for c in got) in ("alpha", "beta")


def test_a_client_that_leaves_takes_its_generation_back(served):
    import httpx

    before = served.call(served.node.read_engine_stats)[0].requests_cancelled
    body = {
        "model": served.model,
        "prompt": LONG,
        "max_tokens": 128,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=served.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and '"text": "' in line and '"text": ""' not in line:
                    break  # the first piece: the engine is generating; leave now
    books = wait_settled(served.url)
    assert not any(books.values()), books          # nothing open, queued, in flight or reserved
    assert served.call(served.node.read_engine_stats)[0].requests_cancelled == before + 1
