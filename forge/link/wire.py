"""The node's side of what crosses to an engine host (the records: forge/host/protocol.py): a broker
request as the WireRequest one engine gets, its prompt in that engine's tokenizer. The host reads it
back with forge/host/wire.py::from_wire."""
from __future__ import annotations

from forge.broker import BrokerRequest
from forge.host.protocol import WireRequest
from forge.requests import DEFAULT_OPTIONS, RequestOptions


def to_wire(req: BrokerRequest, tokenizer_key: str, now: float) -> WireRequest:
    opts = req.payload if isinstance(req.payload, RequestOptions) else None
    return WireRequest(
        req.request_id,
        req.attempt,
        req.prompt_for(tokenizer_key),
        req.max_new_tokens,
        req.priority,
        None if opts is None or opts == DEFAULT_OPTIONS else opts,
        max(0.0, now - req.enqueued_at),
    )
