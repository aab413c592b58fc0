"""forge serve on the embedded tiny node: function endpoints, OpenAPI, and the OpenAI client
library."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.serve.conftest import wait_settled

pytestmark = pytest.mark.engine
openai = pytest.importorskip("openai")

MODEL = "tiny-llama-cpu"


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(
        base_url=served.url + "/v1", api_key="unused-on-loopback", max_retries=0, timeout=60
    )


def test_function_endpoint_runs_the_function(served):
    from functions.classify import CATALOG, SUMMARY_SCHEMA

    r = httpx.post(served.url + "/v1/functions/classify", json={"id": 7, "text": "The ship from "
                                                                                 "abroad came in."},
                   timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == 7 and out["topic"] in CATALOG
    jsonschema.validate(out["card"], SUMMARY_SCHEMA)
    r = httpx.post(served.url + "/v1/functions/summarize", json={"id": "a", "text": "Alice sat by "
                                                                                    "the river."},
                   timeout=60)
    assert r.status_code == 200 and r.json()["id"] == "a" and isinstance(r.json()["summary"], str)


def test_function_errors_are_one_json_line(served):
    # a field the body lacks
    r = httpx.post(served.url + "/v1/functions/classify", json={"id": 1}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.json()
    assert "'text'" in r.json()["error"]["message"] and r.json()["error"]["param"] == "text"
    assert "classify.py" in r.json()["error"]["message"]  # where in user code
    r = httpx.post(served.url + "/v1/functions/classify", content=b"[1, 2]",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(served.url + "/v1/functions/nope", json={}, timeout=30)
    assert r.status_code == 404


def test_openapi_document_lists_every_endpoint(served):
    doc = httpx.get(served.url + "/openapi.json").json()
    for path in (
        "/v1/functions/classify",
        "/v1/functions/summarize",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/v1/generate",
        "/v1/serve",
        "/health",
    ):
        assert path in doc["paths"], path
    assert httpx.get(served.url + "/docs").status_code == 200


def test_openai_client_completions_and_chat(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    c = client.completions.create(
        model=MODEL, prompt="Alice was beginning to", max_tokens=12, temperature=0
    )
    assert c.choices[0].finish_reason in ("stop", "length") and c.choices[0].text
    assert c.usage.completion_tokens <= 12 and c.usage.prompt_tokens > 0
    again = client.completions.create(
        model=MODEL, prompt="Alice was beginning to", max_tokens=12, temperature=0
    )
    assert again.choices[0].text == c.choices[0].text  # greedy is deterministic
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Who is the Queen?"}],
        max_tokens=10,
        temperature=0,
    )
    assert chat.choices[0].message.role == "assistant" and isinstance(
        chat.choices[0].message.content, str
    )


def test_openai_client_streaming(client):
    whole = client.completions.create(
        model=MODEL, prompt="The Mock Turtle said", max_tokens=16, temperature=0
    )
    pieces = list(
        client.completions.create(
            model=MODEL, prompt="The Mock Turtle said", max_tokens=16, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text
    assert pieces[-1].choices[0].finish_reason == whole.choices[0].finish_reason and len(pieces) > 2
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 8
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_openai_client_guided_output(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
    }
    for i in range(6):
        chat = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Describe person {i} as JSON."}],
            max_tokens=40,
            temperature=[0, 1.0][i % 2],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema},
            },
        )
        jsonschema.validate(json.loads(chat.choices[0].message.content), schema)
        c = client.completions.create(
            model=MODEL,
            prompt=f"Record {i}. Mood:",
            max_tokens=6,
            temperature=1.0,
            extra_body={"guided_choice": ["happy", "sad", "curious"]},
        )
        assert c.choices[0].text in ("happy", "sad", "curious")


def test_refusals_name_the_field(client, served):
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="presence_penalty is not supported"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, presence_penalty=0.5)
    with pytest.raises(
        openai.BadRequestError, match="max_tokens 1 cannot hold the shortest choice"
    ):
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=1, extra_body={"guided_choice": ["the Queen"]}
        )
    r = httpx.post(
        served.url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 2},
        headers={"x-forge-deadline": "soon"},
    )
    assert r.status_code == 400 and "x-forge-deadline" in r.json()["error"]["message"]
    assert wait_settled(served.url) == {
        "open_requests": 0,
        "pending": 0,
        "in_flight": 0,
        "kv_reserved": 0,
        "gate_active": 0,
    }
