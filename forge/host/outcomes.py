"""Where a request leaves an admission runtime: delivered with its result, failed with a reason, or
given back to its source (until it has come back too often). Each request taken from the source
leaves exactly once."""
from __future__ import annotations

import logging
from typing import Callable

from forge.engines.interface import EngineResult
from forge.host.protocol import given_up
from forge.host.request import HostRequest
from forge.host.source import AdmissionSource
from forge.stats import EngineStats

log = logging.getLogger("forge.host.admission")
OK_REASONS = frozenset({"eos", "length", "stop"})


class Outcomes:
    def __init__(
        self,
        *,
        engine_id: str,
        source: AdmissionSource,
        deliver: Callable[[HostRequest, EngineResult], None],
        stats: EngineStats,
    ):
        self.engine_id, self.source, self.deliver, self.stats = engine_id, source, deliver, stats

    def delivered(self, req: HostRequest, result: EngineResult, input_tokens: int) -> int:
        """The engine's answer (under the request's key, as the engine got it); returns the tokens
        it delivered."""
        s = self.stats
        done = input_tokens + len(result.output_ids)
        if result.finish_reason in OK_REASONS:
            s.requests_ok += 1
        elif result.finish_reason == "cancelled":
            s.requests_cancelled += 1
        else:
            s.requests_failed += 1
            # a refused or failed request delivered nothing: it must not count as throughput
            done = 0
        s.input_tokens += input_tokens if done else 0
        s.output_tokens += len(result.output_ids) if done else 0
        self.settle(req, result)
        return done

    def requeue(self, reqs: list[HostRequest], reason: str) -> None:
        """Back to the source (to come again as attempt + 1); a request at the attempt limit fails
        instead, with `reason` (given_up: the host applies the limit to what it gives back)."""
        back = []
        for req in reqs:
            why = given_up(reason, req.key.attempt)
            if why is not None:
                self.fail(req, why)
            else:
                back.append(req)
        if not back:
            return
        try:
            self.source.requeue(back)
            self.stats.requests_requeued += len(back)
        except Exception as e:  # noqa: BLE001 - whatever the source says, every request is owed an answer
            for req in back:
                self.fail(req, f"{reason}; could not requeue ({type(e).__name__}: {e})")

    def fail(self, req: HostRequest, message: str) -> None:
        self.stats.requests_failed += 1
        self.settle(
            req,
            EngineResult(request_id=req.key, output_ids=[], finish_reason="error", error=message),
        )

    def settle(self, req: HostRequest, result: EngineResult) -> None:
        """The one place a request leaves with an answer."""
        self.quietly(self.source.on_done, req)
        try:
            self.deliver(req, result)
        except Exception:  # noqa: BLE001 - the caller's bug must not kill the card
            log.exception("card %s: deliver() raised for request %s", self.engine_id, req.key)

    def set_healthy(self, healthy: bool) -> None:
        self.stats.healthy = healthy
        self.quietly(self.source.set_engine_healthy, healthy)

    def quietly(self, fn, *args) -> None:
        """The source's bookkeeping (balancing signal, health) must never break delivery."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001
            log.warning(
                "card %s: source.%s failed: %s", self.engine_id, getattr(fn, "__name__", fn), e
            )
