"""`forge serve` on the local-vllm node (its card worker runs vLLM's CPU engine), through the
`openai` client over real HTTP: stop strings cut the text where vLLM's own server would, guided
choice, per-request seeds."""
from __future__ import annotations

import pytest

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from tests.serve.conftest import ServedNode

openai = pytest.importorskip("openai")
MODEL = "tiny-llama-vllm"
PROMPT = "Alice was beginning to get very tired of sitting by her sister"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    served = ServedNode(targets=("functions/classify.py",))
    served.loaded = load_node(PACKAGED_NODES["local-vllm"])
    served.start(tmp_path_factory.mktemp("srv"))
    yield openai.OpenAI(
        base_url=served.url + "/v1", api_key="unused-on-loopback", max_retries=0, timeout=120
    )
    served.close()


def complete(client, **kw):
    kw.setdefault("temperature", 0)
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, **kw).choices[0]


def test_stop_strings_cut_the_text(client):
    full = complete(client)
    text = full.text
    stop = next(w for w in (" the", " and", " of", " a", " she", " to") if w in text[3:])
    at = text.index(stop, 0)
    cut = complete(client, stop=[stop, "zzz"])
    assert cut.text == text[:at] and cut.finish_reason == "stop"
    kept = complete(client, stop=stop, extra_body={"include_stop_str_in_output": True})
    assert kept.text == text[:at + len(stop)]


def test_guided_choice(client):
    got = complete(client, extra_body={"guided_choice": ["Hatter", "Queen", "Alice"]})
    assert got.text in ("Hatter", "Queen", "Alice")


def test_seeds(client):
    a, b, c = (complete(client, temperature=1.0, seed=s).text for s in (3, 3, 4))
    assert a == b and a != c
