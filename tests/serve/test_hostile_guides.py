"""Hostile guided and seeded requests against a real `forge serve` on the embedded tiny model (real
transformers engine), each answered with the right status naming what the client sent (issue 29, the
serve items): a guide nested past any parser's depth is a 400, not a 500 from a RecursionError; a
schema the answer cannot complete within max_tokens is a 400 that says so, not an engine error; seed
2**63-1 with n=2 is served."""
from __future__ import annotations


import httpx
import pytest

pytestmark = pytest.mark.engine
MODEL = "tiny-llama-cpu"
DEEP = 50_000


def _chat(served, **extra) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "JSON please"}],
        "max_tokens": 8,
        **extra,
    }
    return httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and "\n" not in err["message"], err
    return err


@pytest.mark.parametrize("field", ["guided_json", "structured_outputs"])
def test_a_guide_nested_50k_deep_as_text_is_a_400(served, field):
    deep = "[" * DEEP + "]" * DEEP
    r = _chat(served, **({field: deep} if field == "guided_json" else {field: {"json": deep}}))
    err = _error(r, 400)
    assert err["type"] == "invalid_request_error" and "nested" in err["message"], err
    assert err["param"] in ("guided_json", "structured_outputs.json"), err


def test_a_body_nested_50k_deep_is_a_400(served):
    body = (
        '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "guided_json": ' % MODEL
        + '{"a": ' * DEEP
        + "1"
        + "}" * DEEP
        + "}"
    )
    r = httpx.post(served.url + "/v1/chat/completions", content=body.encode(), timeout=120,
                   headers={"content-type": "application/json"})
    err = _error(r, 400)
    assert "nested" in err["message"], err


def test_a_schema_no_answer_completes_within_max_tokens_is_a_400_naming_max_tokens(served):
    # a shortest answer past the up-front search (1,024 tokens): not refused before generating; the
    # guide then cannot close within 8 tokens. The engine's refusal (the caller's budget), not an
    # engine error.
    r = _chat(
        served, guided_json={"type": "string", "minLength": 3000}, max_tokens=8, temperature=0
    )
    err = _error(r, 400)
    assert err["type"] == "invalid_request_error", err
    assert "max_tokens 8 ran out before the guided output was complete" in err["message"], err


def test_the_largest_seed_with_two_choices_is_served(served):
    r = httpx.post(
        served.url + "/v1/completions",
        timeout=120,
        json={
            "model": MODEL,
            "prompt": "Once",
            "max_tokens": 3,
            "seed": 2**63 - 1,
            "n": 2,
            "temperature": 1.0,
        },
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2
    r = httpx.post(
        served.url + "/v1/completions",
        timeout=120,
        json={"model": MODEL, "prompt": "Once", "max_tokens": 3, "seed": 2**64 - 1, "n": 2},
    )
    err = _error(r, 400)  # vLLM's range, which no engine here takes: named as sent
    assert str(2**64 - 1) in err["message"] and str(2**64) not in err["message"], err
