"""A client's mistake in a guided request is a 400 naming it, up front: a JSON Schema that is not
one, or whose references must nest forever (no finite value), never a 500 from inside the engine."""
from __future__ import annotations

import httpx
import pytest

from forge.requests.schema_check import schema_problem

pytestmark = pytest.mark.engine
MODEL = "tiny-llama-cpu"
SELF_REF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
REQUIRED_CHILD = {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]}


@pytest.mark.parametrize(
    "schema, problem",
    [
        (SELF_REF, "no finite value: #/$defs/a -> #/$defs/a"),
        (REQUIRED_CHILD, "no finite value: # -> #/properties/child -> #"),
        (
            {"allOf": [{"$ref": "#/$defs/b"}], "$defs": {"b": {"allOf": [{"$ref": "#"}]}}},
            "no finite value",
        ),
        (
            {
                "type": "object",
                "properties": {"k": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
                "required": ["k"],
            },
            "no finite value",
        ),
        (
            {"type": "objekt"},
            "not a valid JSON Schema: 'objekt' is not valid under any of the given "
            "schemas (at #/type)",
        ),
        ({"type": "object", "properties": {"child": {"$ref": "#"}}}, None),  # can stop: optional
        (
            {
                "type": "object",
                "properties": {"k": {"type": "array", "items": {"$ref": "#"}}},
                "required": ["k"],
            },
            None,
        ),
        ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, None),
        ({"$ref": "#/$defs/missing"}, None),  # left to the engine's compiler, which names it
    ],
)
def test_schema_problems(schema, problem):
    got = schema_problem(schema)
    assert (got is None) if problem is None else (problem in (got or "")), got


@pytest.mark.parametrize("field", ["guided_json", "response_format"])
@pytest.mark.parametrize("schema", [SELF_REF, REQUIRED_CHILD, {"type": "objekt"}])
def test_bad_schemas_are_400_not_500(served, field, schema):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "JSON please"}],
        "max_tokens": 20,
    }
    body[field] = (
        schema
        if field == "guided_json"
        else {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        err["type"] == "invalid_request_error"
        and "json_schema" in err["message"]
        and "\n" not in err["message"]
    )


def test_a_chat_template_refusal_is_the_clients_mistake():
    """A template that raises (Llama-2-style ones require alternating roles) is a RequestRejected
    naming the messages (a 400 on forge serve), not a 500. The tiny model has no template, so the
    tokenizer here is a stand-in holding one, rendered by forge's bounded renderer."""
    from forge.errors import RequestRejected
    from forge.requests.chat_template import apply_template
    from forge.requests.messages import Chat

    class Templated:
        chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"

    chat = Chat.of(
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
        transcript_fallback=True,
    )
    with pytest.raises(RequestRejected, match="the model's chat template refused the messages: "
                                              "Conversation roles "
                                              "must alternate"):
        apply_template([Templated()], chat, limit_chars=10_000)


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {}},
        {"not": True},
        {"allOf": [{"type": "string"}, False]},
        {"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]},
    ],
)
def test_a_schema_that_admits_nothing_is_refused_up_front(schema):
    got = schema_problem(schema)
    assert (
        got is not None and got.startswith("json_schema admits no value: #") and "\n" not in got
    ), got
    # a way out: left alone
    assert schema_problem({"anyOf": [{"not": {}}, {"type": "string"}]}) is None
