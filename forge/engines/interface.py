"""The engine interface: everything the admission runtime needs from an in-flight batcher.

An Engine is built from a contract (and the card's plan) by its backend's factory, with exactly the
contract's settings. It runs its own generation loop (a thread, or the vendor's executor); forge
talks to it through five calls, none of which may block longer than the timeout it is given:

    submit(requests)        hand requests to the in-flight batcher (raises EngineBusy to refuse)
    poll(timeout_s)         results and token progress since the last poll (bounded wait)
    cancel(request_id)      stop a request; its result comes back with finish_reason "cancelled"
    stats()                 iteration stats (active, queued, KV blocks, tokens this step)
    shutdown(timeout_s)     stop the loop and free the card

Tokenization belongs to the engine (its tokenizer is the one the broker measures with).

A request's id is opaque to the engine: in an engine host it is the request's RequestKey (session,
rid, attempt), made once from the wire and carried unchanged into the engine and back in its
EngineResult. An engine whose library wants text for an id uses `str(request_id)`
(RequestKey.__str__), nothing else: the id is never rewritten.
"""
from __future__ import annotations

import abc
import math
import time
from dataclasses import dataclass, field
from typing import Any, Hashable, NamedTuple, Optional, Protocol, Sequence

from forge import constants


class EngineBusy(Exception):
    """The engine refused new work for now (queue full); the runtime retries with bounded
    backoff."""


class EngineFailed(Exception):
    """The engine is dead (crashed loop, lost device). In-flight requests must be requeued or
    failed."""


@dataclass(frozen=True)
class Sampling:
    """How to pick tokens. temperature 0 is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop_at_eos: bool = True


def sampling_problem(s: Sampling) -> Optional[str]:
    """What every engine can represent, checked again at its submit (GenerateParams checks it where
    requests enter): samplers hold top_k as int32 and divide float32 logits by the temperature, so a
    top_k of 2**31 or a NaN temperature reaching an engine's loop would end it for every request on
    the card."""
    t, p, k = s.temperature, s.top_p, s.top_k
    if not (
        isinstance(t, (int, float))
        and math.isfinite(t)
        and (
            t == 0 or constants.MIN_SAMPLING_TEMPERATURE <= t <= constants.MAX_SAMPLING_TEMPERATURE
        )
    ):
        return (f"invalid sampling: temperature {t!r} is not 0 or in "
                f"[{constants.MIN_SAMPLING_TEMPERATURE:g}, "
                f"{constants.MAX_SAMPLING_TEMPERATURE:g}]")
    if not (isinstance(p, (int, float)) and math.isfinite(p) and 0 < p <= 1):
        return f"invalid sampling: top_p {p!r} is not in (0, 1]"
    if not (isinstance(k, int) and 0 <= k <= constants.INT32_MAX):
        return f"invalid sampling: top_k {k!r} is not an int in [0, 2**31 - 1]"
    return None


@dataclass(frozen=True)
class Guide:
    """Guided output: exactly one of choice | json_schema | regex. Backends that cannot honour it
    refuse."""

    choice: Optional[tuple[str, ...]] = None
    json_schema: Optional[dict] = None
    regex: Optional[str] = None


class RequestKey(NamedTuple):
    """One dispatch of a request to an engine host: the link session it came on, the node's request
    id, and the node's attempt (a requeued request comes back with attempt + 1, so a key is never
    dispatched twice)."""

    session: str
    rid: str
    attempt: int

    def __str__(self) -> str:
        """The key as text, for an engine library that takes string ids (vLLM, transformers): the
        one place a key becomes a string. Sessions and node request ids are hex and dashes, so the
        text is unique per key."""
        return f"{self.session}|{self.rid}|{self.attempt}"


@dataclass(frozen=True)
class EngineRequest:
    # The request's id, unique among what the engine may still hold: a RequestKey in an engine host
    # (any hashable whose str() is unique works, as engine tests use plain strings). Results come
    # back under it unchanged.
    request_id: Hashable
    prompt_ids: tuple[int, ...]      # already tokenized with this engine's tokenizer
    max_new_tokens: int              # never above the contract's max_output_len (the broker checks)
    sampling: Sampling = Sampling()
    guide: Optional[Guide] = None
    want_hidden: bool = False        # return the final hidden state (embed)
    priority: int = 0  # the broker's (higher first; online work is above 0): for an engine that
                       # orders its own waiting queue (vLLM), ignored by the others
    stream: bool = False             # report this request's tokens as they come (Progress.partials)


REFUSED = "refused"


@dataclass
class EngineResult:
    request_id: Hashable             # the EngineRequest's, unchanged
    output_ids: list[int]
    finish_reason: str               # "eos" | "length" | "stop" | "cancelled" | "error" | REFUSED
    # REFUSED: the engine cannot run the request as asked (a guide or sampling mode it does not
    # offer, a length it cannot hold) - the caller's to fix (RequestRejected, HTTP 400); "error":
    # the engine failed the request. Either way `error` says why.
    hidden: Optional[list[float]] = None
    error: Optional[str] = None


@dataclass
class Progress:
    """What a poll returns: finished results plus how many new tokens each running request
    produced."""

    results: list[EngineResult] = field(default_factory=list)
    new_tokens: int = 0              # tokens generated since the last poll (all requests)
    # (request_id, every output id so far) of running requests that asked to stream and grew since
    # the last poll
    partials: list[tuple[Hashable, list[int]]] = field(default_factory=list)


@dataclass
class IterationStats:
    """A snapshot of the in-flight batcher, as the engine sees it."""

    timestamp: float = field(default_factory=time.time)
    active: int = 0                  # sequences in flight
    queued: int = 0                  # accepted but not yet scheduled
    kv_blocks_used: int = 0
    kv_blocks_free: int = 0
    tokens_last_step: int = 0        # tokens processed by the last engine step (vs max_num_tokens)
    steps: int = 0                   # engine steps since start
    prefix_hit_tokens: int = 0  # prompt tokens served from the engine's block reuse, cumulative
    # sequences the engine evicted and must recompute, cumulative (forge's admission reserves KV so
    # this stays 0; engines without preemption report 0)
    preemptions: int = 0


class Tokenizer(Protocol):
    eos_token_id: Optional[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Engine(abc.ABC):
    """One engine on one card. See the module docstring for the contract of each call."""

    name: str = "engine"
    tokenizer: Tokenizer
    supports_hidden: bool = False
    supports_guides: frozenset[str] = frozenset()   # subset of {"choice", "json_schema", "regex"}
    # Whether a request scheduled in the same step as the first computation of its prompt's prefix
    # reuses it (vLLM registers a block when it allocates it). False (transformers registers a block
    # after the forward that completed it): the broker sends a prefix group new to the engine its
    # leader alone (forge/broker/warming.py).
    shares_prefix_within_step: bool = True
    # Whether the broker serves this engine's bulk work by output class above prefix group (longest
    # first across every group: docs/broker.md, "Longest first"). True suits a step that pays for a
    # mixed batch (transformers' SDPA path pads every query to the batch's KV read). False (vLLM:
    # ragged steps that mix prefill with decode) keeps a prefix group's requests together whatever
    # their lengths, so its blocks are reused before eviction.
    output_classes_first: bool = True
    # Whether the engine keeps requests beyond its slots in a waiting queue of its own and schedules
    # them into the very step in which a slot frees (vLLM's scheduler). True: admission hands it up
    # to max_batch_size requests more than its slots, each with the same KV reservation as a running
    # one (so it still never preempts); a finished request's slot is then refilled at once, not one
    # round trip (event loop, node) later, when a batch that started together also ends together and
    # the engine would otherwise run dry (docs/admission.md).
    queues_beyond_slots: bool = False

    @abc.abstractmethod
    def submit(self, requests: Sequence[EngineRequest]) -> None: ...

    @abc.abstractmethod
    def poll(self, timeout_s: float) -> Progress: ...

    @abc.abstractmethod
    def cancel(self, request_id: Hashable) -> None: ...

    @abc.abstractmethod
    def stats(self) -> IterationStats: ...

    @abc.abstractmethod
    def shutdown(self, timeout_s: float) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Settings the engine was started with, for logs and `forge status` (backend-specific)."""
        return {}
