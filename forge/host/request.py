"""A request inside an engine host: what a wire request becomes when it arrives
(forge/host/wire.py::from_wire), from the host's queue through admission to the engine and back to
the link.

Its key (forge/engines/interface.py::RequestKey: session, the node's request id, attempt) is made
once, on arrival, and is the request's only id from then on: the queue's, the in-flight table's, the
engine's (EngineRequest and EngineResult carry it unchanged) and the result's on its way back to the
link."""
from __future__ import annotations

from dataclasses import dataclass

from forge.engines.interface import RequestKey
from forge.requests import DEFAULT_OPTIONS, RequestOptions


@dataclass(eq=False, slots=True)
class HostRequest:
    """Identity equality, as the same object travels from the queue to the engine and back."""

    key: RequestKey
    prompt: tuple[int, ...]                  # token ids in this engine's tokenizer
    max_new_tokens: int
    priority: int = 0  # higher is taken first (the node's; online work is above 0)
    options: RequestOptions = DEFAULT_OPTIONS
    enqueued_at: float = 0.0  # time.monotonic() here of when the node's broker first queued it
    abandoned: bool = False   # the node's caller left while it was queued: admission drops it
