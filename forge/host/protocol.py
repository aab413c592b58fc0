"""The seam between a node's link and an engine host, declared: the host's methods (HostMethod),
what a batch carries each way (WireRequest node -> host, WireResult host -> node), and the two
structured replies (Hello, once per connection; Collected, every long poll). The same records cross
every carrier (forge/link/: thread, worker process, Ray actor); forge/host/engine_host.py implements
the methods, forge/link/transport.py calls them.

Records are NamedTuples, so they are tuples: built, indexed and unpacked as cheaply. Where a call is
pickled (the worker process's socket, Ray), batches travel as plain tuples and are rebuilt with
`_make` on arrival: pickling a NamedTuple as is carries its class and calls its Python constructor
per item on load, which measured 2-3 µs more per item than a plain tuple (4096-item batches),
against ~0.2 µs for tuple() + _make. `submit` sends plain tuples on every carrier (Transport.submit;
the host rebuilds them); `Collected` turns its results into plain tuples only when pickled (its
__reduce__), so the thread carrier copies nothing.

(rid, attempt) is a dispatch's identity: the node accepts a result only for the dispatch it is
waiting on, so an answer from an engine that was given up on (lost, restarted, orphaned) is
ignored."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Sequence

from forge import constants
from forge.broker import EngineGeometry
from forge.requests import RequestOptions
from forge.stats import EngineStats


# How often a host's engine driver samples engine.stats(): a host's counters are at most this old
# when read, which the node's link allows for (forge/host/driver.py samples, forge/link/link.py
# waits).
STATS_INTERVAL_S = 0.1


def given_up(reason: str, attempt: int) -> Optional[str]:
    """The attempt limit (constants.REQUEST_ATTEMPT_LIMIT), one rule for every way a request comes
    back: a dispatch at the limit that comes back (`reason`) is not sent again but given up, with
    the message returned here; None while it may go again. Applied once on each path, by whoever
    knows why it came back: the host to what it gives back (admission's give-backs,
    forge/host/outcomes.py; what never reached admission, link_sessions.py, which the link fails as
    Collected.given_up says), the link to what it loses with its host (forge/link/link.py)."""
    if attempt >= constants.REQUEST_ATTEMPT_LIMIT:
        return f"{reason}; gave up after {attempt + 1} attempts"
    return None


class HostMethod(str, enum.Enum):
    """Every call a link may make of its engine host: each is a coroutine method of EngineHost and a
    typed method of Transport of the same name (tests/host/test_protocol.py holds the three
    together)."""

    HELLO = "hello"                      # -> Hello
    # -> (the node's copy of the tokenizer, [(probe text, engine's ids)])
    TOKENIZER_COPY = "tokenizer_copy"
    ENCODE = "encode"                    # (texts) -> one list of ids per text
    SUBMIT = "submit"                    # (session, [WireRequest]) -> how many were queued
    COLLECT = "collect"                  # (session, wait_s, max_items) -> Collected
    CANCEL = "cancel"                    # (session, [(rid, attempt)]) -> how many were still there
    END_SESSION = "end_session"          # (session) -> None
    STATS = "stats"                      # -> EngineStats
    DRAIN = "drain"                      # (within_s) -> True when nothing was cut short
    STOP = "stop"                        # -> None


class WireRequest(NamedTuple):
    """One dispatch, node -> host."""

    rid: str               # the node's request id
    attempt: int           # how many times it was dispatched before (requeued after a loss)
    prompt: Sequence[int]  # prompt ids, in this engine's tokenizer
    max_new_tokens: int
    priority: int
    # None for the defaults (DEFAULT_OPTIONS), which then need not travel
    options: Optional[RequestOptions]
    age_s: float                         # seconds it had waited in the node's broker when sent


class WireResult(NamedTuple):
    """One dispatch's answer, host -> node."""

    rid: str
    attempt: int
    finish_reason: str                   # eos | length | stop | cancelled | error | refused ...
    output_ids: list[int]
    text: str               # decoded output ("" for errors, refusals and hidden-state requests)
    hidden: Optional[list]  # the hidden states asked for (RequestOptions.want_hidden), else None
    error: Optional[str]
    input_tokens: int


def requests_to_send(items: Sequence[WireRequest]) -> list[tuple]:
    """A submit's batch as it crosses any carrier: plain tuples (see the module docstring)."""
    return list(map(tuple, items))


def requests_received(items: Sequence[tuple]) -> list[WireRequest]:
    """The inverse of requests_to_send, for a reader that wants the records (the host reads the
    tuples directly: forge/host/wire.py::from_wire)."""
    return list(map(WireRequest._make, items))


class Delivered(NamedTuple):
    """What the engine delivered since the session's last collect: the node broker's balancing
    signal."""

    tokens: int
    elapsed_s: float  # busy seconds it took
    occupancy: float  # mean share of the engine's slots in use over those seconds


NOTHING_DELIVERED = Delivered(0, 0.0, 1.0)


@dataclass(frozen=True, slots=True)
class Collected:
    """A collect's answer: what is ready for one link session, and the host's health with it."""

    results: list[WireResult]
    # (rid, attempt) given back unstarted: the node requeues them (as the next attempt: the host
    # applied the attempt limit, see given_up)
    returned: list[tuple[str, int]]
    delivered: Delivered
    more: bool             # more results wait than max_items let through: collect again at once
    incarnation: str = ""  # the host's; a different one than the link knew means it restarted
    healthy: bool = True
    accepting: bool = True               # False while draining or stopping
    state: str = ""  # the admission runtime's state (running, stalled, wedged, failed ...)
    failure: Optional[str] = None  # why the engine failed (it is gone; the link gives its card up)
    # sent with every answer that carries work, else every STATS_EVERY_S
    stats: Optional[EngineStats] = None
    ended: bool = False  # the session was ended (its lease ran out): what it held is gone
    # (rid, attempt, text) pieces of streamed requests' output, in order; only requests sent with
    # RequestOptions.stream have any. Their WireResult still comes whole at the end.
    partials: list[tuple[str, int, str]] = field(default_factory=list)
    # (rid, attempt, message): given back at the attempt limit (given_up()); the node fails each
    # with its message
    given_up: list[tuple[str, int, str]] = field(default_factory=list)

    @classmethod
    def ended_session(cls, incarnation: str) -> Collected:
        return cls([], [], NOTHING_DELIVERED, False, incarnation=incarnation, ended=True)

    def __reduce__(self):
        # Pickled (worker process, Ray): results as plain tuples, rebuilt on load. Positional:
        # _collected's order.
        return (
            _collected,
            (
                list(map(tuple, self.results)),
                self.returned,
                tuple(self.delivered),
                self.more,
                self.incarnation,
                self.healthy,
                self.accepting,
                self.state,
                self.failure,
                self.stats,
                self.ended,
                self.partials,
                self.given_up,
            ),
        )


def _collected(results: list[tuple], returned, delivered: tuple, *rest) -> Collected:
    return Collected(
        list(map(WireResult._make, results)), returned, Delivered._make(delivered), *rest
    )


@dataclass(frozen=True)
class Hello:
    """Who and what an engine host is: its answer when a link connects (or reconnects)."""

    engine_id: str    # the broker's name for it: card id (cpu0, cpu0.r1) or node/card on Ray
    incarnation: str  # new each time the host is built: a restart is seen by its change
    node: str
    card: str
    replica: int
    model: str                           # the card's model (as NVML names it; "cpu" for a CPU card)
    tier: str                            # its contract's name
    backend: str
    geometry: EngineGeometry             # what the node's broker sizes this engine's batches by
    host: str                            # the machine's host name
    pid: int
    load_s: float                        # seconds the engine took to build
    started_at: float                    # wall clock
    limits: dict[str, Any]               # the contract's limits, as its model_dump()
    kv_blocks: int
    full_length_slots: int               # full-length sequences the KV pool holds at once
    guides: list[str]                    # guided-output kinds the engine supports (sorted)
    hidden: bool                         # it can return hidden states
    engine: dict[str, Any]               # the engine's describe(): settings it started with
    lifeline: dict[str, Any]             # how the host's process dies with its parent
    gc: dict[str, Any]                   # the host process's cyclic-GC setting (threshold, frozen)
    stats: EngineStats                   # its counters now (a link counts its job from here)
    # Ray only: the actor's orphan guard in force
    guard: dict[str, Any] = field(default_factory=dict)
    ray_node_id: str = ""                                  # Ray only: the Ray node it runs on
