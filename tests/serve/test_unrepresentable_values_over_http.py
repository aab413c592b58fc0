"""Over HTTP, a value no engine can represent is that request's 4xx (or that item's error), never a
500 and never a dead card (issue 13, item 2); `logprobs: 0` asks for logprobs and is refused as
documented."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.engine

MODEL = "tiny-llama-cpu"


def _completion(url, **kw):
    return httpx.post(
        url + "/v1/completions",
        json={"model": MODEL, "prompt": "Alice", "max_tokens": 2, **kw},
        timeout=60,
    )


@pytest.mark.parametrize("kw", [{"top_k": 2**31}, {"temperature": 1e-30}, {"seed": 2**63}])
def test_openai_requests_past_the_engines_limits_are_400_and_the_node_serves_on(served, kw):
    r = _completion(served.url, **kw)
    assert r.status_code == 400, r.text
    assert list(kw)[0] in r.json()["error"]["message"]
    ok = _completion(served.url, temperature=0)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("value", [0, 1, 5, True])
def test_logprobs_other_than_false_are_refused(served, value):
    r = _completion(served.url, logprobs=value)
    assert 400 <= r.status_code < 500 and "logprobs" in r.text, (r.status_code, r.text)
    assert _completion(served.url, logprobs=None).status_code == 200   # completions: an int or null


def test_one_bad_item_of_a_node_batch_fails_alone(served):
    items = [{"prompt": "Alice", "max_tokens": 2, "top_k": 2**31, "temperature": 0.7},
             {"prompt": "Alice", "max_tokens": 2}]
    r = httpx.post(served.url + "/v1/generate", json={"requests": items}, timeout=60)
    assert r.status_code == 200, r.text
    bad, good = r.json()["results"]
    assert bad["error"]["type"] == "RequestRejected" and "top_k" in bad["error"]["message"]
    assert good["output_tokens"] == 2
