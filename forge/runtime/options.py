"""What a caller attaches to a BrokerRequest's payload so the admission runtime can build the
EngineRequest. The broker never looks inside a payload; the runtime reads these attributes by name, so
any payload object with `sampling`, `guide`, `want_hidden` and `deadline_s` works (the node's LLM
handle puts a RequestOptions there). A payload without them gets the defaults below."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from forge.engines.interface import Guide, Sampling


@dataclass(frozen=True)
class RequestOptions:
    sampling: Sampling = Sampling()
    guide: Optional[Guide] = None
    want_hidden: bool = False
    # Seconds allowed from the moment the request entered the broker (BrokerRequest.enqueued_at) to
    # its result. Past it the runtime cancels the request in the engine and delivers an error result
    # ("deadline exceeded"). None: no deadline.
    deadline_s: Optional[float] = None


def options_of(payload: Any) -> RequestOptions:
    """The options carried by a payload (duck-typed), with defaults for whatever it lacks."""
    if isinstance(payload, RequestOptions):
        return payload
    sampling = getattr(payload, "sampling", None)
    return RequestOptions(sampling=sampling if isinstance(sampling, Sampling) else Sampling(),
                          guide=getattr(payload, "guide", None),
                          want_hidden=bool(getattr(payload, "want_hidden", False)),
                          deadline_s=getattr(payload, "deadline_s", None))
