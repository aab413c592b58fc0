"""The options of one request below the node's edge, and how a result says the request was refused.

A caller's GenerateParams (forge/functions/api.py, also what the HTTP endpoint reads) is checked once, at the
node's edge, and turned into RequestOptions there. From then on RequestOptions is the only form: the node's
broker carries it as the request's payload, and the links carry it to an engine host as is (a frozen
dataclass: pickled on the process link and on Ray, passed by reference on the thread link; None stands for
the defaults, so most requests carry nothing). The admission runtime reads it to build the EngineRequest.

Imports nothing of forge but the engine interface's plain value types."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from forge.engines.interface import REFUSED, Guide, Sampling

__all__ = ["REFUSED", "RequestOptions", "DEFAULT_OPTIONS", "options_of"]   # REFUSED: a result's typed refusal


@dataclass(frozen=True)
class RequestOptions:
    sampling: Sampling = Sampling()
    guide: Optional[Guide] = None
    want_hidden: bool = False
    # Seconds allowed from the moment the request entered the broker (BrokerRequest.enqueued_at) to
    # its result. Past it the runtime cancels the request in the engine and delivers an error result
    # ("deadline exceeded"). None: no deadline.
    deadline_s: Optional[float] = None

    @classmethod
    def of(cls, params: Any) -> Optional["RequestOptions"]:
        """From a GenerateParams (read by attribute name); None when every option is the default."""
        guide = None
        if params.choice is not None or params.json_schema is not None:
            guide = Guide(choice=tuple(params.choice) if params.choice is not None else None,
                          json_schema=params.json_schema)
        if (not params.temperature and params.top_p == 1.0 and not params.top_k and params.seed is None
                and guide is None and not params.embed and params.deadline_s is None):
            return None
        return cls(sampling=Sampling(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                     seed=params.seed),
                   guide=guide, want_hidden=params.embed, deadline_s=params.deadline_s)


DEFAULT_OPTIONS = RequestOptions()


def options_of(payload: Any) -> RequestOptions:
    """The options a broker request carries: its payload itself, or the payload's `options`; defaults if none."""
    if isinstance(payload, RequestOptions):
        return payload
    opts = getattr(payload, "options", None)
    return opts if isinstance(opts, RequestOptions) else DEFAULT_OPTIONS
