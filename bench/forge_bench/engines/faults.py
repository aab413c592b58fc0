"""The `faults` backend: a real engine (any registered backend) with faults injected, for testing
the admission runtime against the failures engines really have (hangs with work in flight, refusals,
crashes, slowness).

    backend: faults
    faults:
      wraps: transformers           # the inner backend, built by its own registered factory from this contract
      freeze_after_requests: 4      # after 4 results, produce nothing (no tokens, no results, stats frozen)
      freeze_for_s: 2.0             #   ... for this long, then recover (default: frozen for good)
      slow_factor: 3.0              # every result is held back: 3x as long as the inner engine took for it
      crash_after_requests: 10      # after 10 results, submit/poll/cancel raise EngineFailed
      refuse_first_submits: 2       # the first 2 submit calls raise EngineBusy

Counts are of results handed out, and a threshold is exact: with `freeze_after_requests: 4` exactly
4 results come out before the freeze, the rest are held (and released after recovery). A frozen
engine still honours its poll timeout, as the interface requires; it just has nothing to say."""
from __future__ import annotations

import threading
import time
from typing import Any, Hashable, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forge.backends import Backend
from forge.engines.interface import (
    Engine,
    EngineBusy,
    EngineFailed,
    EngineRequest,
    EngineResult,
    IterationStats,
)
from forge.engines.interface import Progress
from forge.errors import ForgeError, display_path
from forge_bench.engines.instant import section_of

BACKEND = "faults"


class FaultsSection(BaseModel):
    """`faults:` contract section: the inner backend and the faults to inject (at least one)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    wraps: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the inner backend, "
                                                                            "e.g. transformers")
    freeze_after_requests: Optional[int] = Field(None, ge=0, description="freeze after this many "
                                                                         "results")
    freeze_for_s: Optional[float] = Field(None, gt=0, description="recover this long after "
                                                                  "freezing; default never")
    slow_factor: Optional[float] = Field(None, ge=1, description="each request takes this many "
                                                                 "times as long")
    crash_after_requests: Optional[int] = Field(None, ge=0, description="fail for good after this "
                                                                        "many results")
    refuse_first_submits: Optional[int] = Field(None, ge=0, description="the first N submit calls "
                                                                        "raise EngineBusy")

    @model_validator(mode="after")
    def _sensible(self) -> "FaultsSection":
        if self.wraps == BACKEND:
            raise ValueError("faults cannot wrap itself")
        if self.freeze_for_s is not None and self.freeze_after_requests is None:
            raise ValueError("freeze_for_s needs freeze_after_requests")
        if all(
            v is None
            for v in (
                self.freeze_after_requests,
                self.slow_factor,
                self.crash_after_requests,
                self.refuse_first_submits,
            )
        ):
            raise ValueError("names no fault (freeze_after_requests | slow_factor | "
                             "crash_after_requests | "
                             "refuse_first_submits)")
        return self


class FaultyEngine(Engine):
    def __init__(self, inner: Engine, faults: FaultsSection):
        self.inner, self.faults = inner, faults
        self.name = f"{BACKEND}({inner.name})"
        self.tokenizer = inner.tokenizer
        self.supports_hidden, self.supports_guides = inner.supports_hidden, inner.supports_guides
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._returned = 0                      # results handed out
        self._refusals_left = faults.refuse_first_submits or 0
        self._submitted_at: dict[str, float] = {}
        self._held: list[tuple[float, EngineResult]] = []   # (release time, result)
        self._frozen_since: Optional[float] = None
        self._froze = False                     # a freeze happens once
        self._last_stats = IterationStats()

    def describe(self) -> dict[str, Any]:
        return {
            "backend": BACKEND,
            "faults": self.faults.model_dump(exclude_none=True),
            "inner": self.inner.describe(),
        }

    # ------------------------------------------------------------------ fault state
    def _check_crash(self) -> None:
        n = self.faults.crash_after_requests
        if n is not None and self._returned >= n:
            raise EngineFailed(f"injected crash after {n} results")

    def frozen(self, now: Optional[float] = None) -> bool:
        if self._frozen_since is None:
            return False
        span = self.faults.freeze_for_s
        if span is not None and (now or time.monotonic()) - self._frozen_since >= span:
            self._frozen_since = None           # recovered
            return False
        return True

    # ------------------------------------------------------------------ Engine
    def submit(self, requests: Sequence[EngineRequest]) -> None:
        with self._lock:
            self._check_crash()
            if self._refusals_left > 0:
                self._refusals_left -= 1
                raise EngineBusy("injected refusal")
        self.inner.submit(requests)
        now = time.monotonic()
        with self._lock:
            for r in requests:
                self._submitted_at[r.request_id] = now

    def cancel(self, request_id: Hashable) -> None:
        with self._lock:
            self._check_crash()
        self.inner.cancel(request_id)

    def poll(self, timeout_s: float) -> Progress:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._lock:
            self._check_crash()
        if self.frozen():
            self._closed.wait(max(deadline - time.monotonic(), 0.0))
            return Progress()
        out, new_tokens = [], 0
        while True:
            now = time.monotonic()
            out = self._release(now)
            remaining = deadline - now
            if out or new_tokens or remaining <= 0 or self._closed.is_set():
                break
            next_release = min((t for t, _ in self._held), default=None)
            wait = (
                remaining if next_release is None else min(remaining, max(next_release - now, 0.0))
            )
            p = self.inner.poll(wait)
            new_tokens += p.new_tokens
            self._hold(p.results, time.monotonic())
        return Progress(
            results=self._limit(out), new_tokens=0 if self._frozen_since is not None else new_tokens
        )

    def _hold(self, results: list[EngineResult], now: float) -> None:
        factor = self.faults.slow_factor or 1.0
        with self._lock:
            for r in results:
                took = now - self._submitted_at.pop(r.request_id, now)
                self._held.append((now + (factor - 1.0) * took, r))

    def _release(self, now: float) -> list[EngineResult]:
        with self._lock:
            ready = sorted((h for h in self._held if h[0] <= now), key=lambda h: h[0])
            self._held = [h for h in self._held if h[0] > now]
        return [r for _, r in ready]

    def _limit(self, ready: list[EngineResult]) -> list[EngineResult]:
        """Hand out results up to the next threshold exactly; hold the rest; start a freeze when reached."""
        caps = [
            n
            for n in (
                self.faults.crash_after_requests,
                None if self._froze else self.faults.freeze_after_requests,
            )
            if n is not None
        ]
        cap = min(caps) - self._returned if caps else len(ready)
        give, keep = ready[:max(cap, 0)], ready[max(cap, 0):]
        with self._lock:
            now = time.monotonic()
            self._held.extend((now, r) for r in keep)
            self._returned += len(give)
            n = self.faults.freeze_after_requests
            if n is not None and not self._froze and self._returned >= n:
                self._froze, self._frozen_since = True, now
        return give

    def stats(self) -> IterationStats:
        if self.frozen():
            return self._last_stats
        self._last_stats = self.inner.stats()
        return self._last_stats

    def shutdown(self, timeout_s: float) -> None:
        self._closed.set()
        self.inner.shutdown(timeout_s)


def _factory(contract, plan) -> FaultyEngine:
    faults = section_of(contract, BACKEND, FaultsSection)
    where = display_path(contract.source) if contract.source else f"contract {contract.contract}"
    if faults is None:
        raise ForgeError(f"{where}::$.faults: backend faults needs a `faults:` section naming the "
                         "inner backend")
    from forge.backends import factories as backend_factories

    factories = backend_factories()
    if faults.wraps not in factories:
        raise ForgeError(f"{where}::$.faults.wraps: unknown backend {faults.wraps!r} "
                         f"(known: {', '.join(sorted(set(factories) - {BACKEND}))})")
    return FaultyEngine(factories[faults.wraps](contract, plan), faults)


def backend() -> Backend:
    """The `faults` backend as one object; forge_bench.plugin registers it."""
    return Backend(name=BACKEND, factory=_factory, section=FaultsSection,
                   label="any backend with faults injected (tests)")
