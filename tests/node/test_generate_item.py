"""The one encoder of a call's settings for a provisioned node's /v1/generate (forge deploy's
RemoteNode and forge serve --remote both use it): every setting a function can pass arrives in the
endpoint's item as given (forge deploy used to drop deadline_s)."""
from __future__ import annotations

from forge.functions.api import GenerateParams
from forge.node.endpoint import GenerateItem
from forge.node.remote import generate_item


def test_every_setting_survives_the_wire_item():
    params = GenerateParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        seed=3,
        priority=2,
        deadline_s=2.5,
        choice=("yes", "no"),
    )
    item = GenerateItem.model_validate(generate_item((1, 2, 3), params))
    assert item.prompt == [1, 2, 3]
    assert (
        item.max_tokens,
        item.temperature,
        item.top_p,
        item.top_k,
        item.seed,
        item.priority,
        item.deadline_s,
        item.choice,
        item.embed,
    ) == (7, 0.5, 0.9, 40, 3, 2, 2.5, ["yes", "no"], False)
    schema = {"type": "object"}
    item = GenerateItem.model_validate(
        generate_item("text", GenerateParams(max_tokens=1, json_schema=schema))
    )
    assert item.prompt == "text" and item.json_schema == schema and item.deadline_s is None


def test_stops_and_chat_messages_travel_whole():
    """The node's own submit applies stop strings and the chat template: RemoteNode forwards them,
    never drops them."""
    from forge.requests.messages import Chat

    params = GenerateParams(max_tokens=5, stop=("\n", "END"), include_stop_str_in_output=True)
    chat = Chat.of(
        [{"role": "developer", "content": [{"type": "text", "text": "hi"}]}],
        transcript_fallback=True,
    )
    item = GenerateItem.model_validate(generate_item(chat, params))
    assert item.prompt is None and item.messages == [{"role": "system", "content": "hi"}]
    assert item.transcript_fallback is True
    assert item.stop == ["\n", "END"] and item.include_stop_str_in_output is True
