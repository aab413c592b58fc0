"""A link's numbers for its engine: engine counters are cumulative over the engine host's life (and
start again at a restart; a Ray actor also outlives jobs); a link reports what happened since it
attached."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from forge.stats import EngineStats

COUNTERS = (
    "input_tokens",
    "output_tokens",
    "requests_ok",
    "requests_failed",
    "requests_cancelled",
    "requests_requeued",
    "admission_refusals",
    "retries",
    "stalls",
    "progress_only_steps",
    "engine_steps",
    "prefix_hit_tokens",
    "preemptions",
)


class JobCounters:
    """Counters since the job attached, carried across engine restarts; gauges as last reported."""

    def __init__(self) -> None:
        self.carried = dict.fromkeys(COUNTERS, 0)
        self.base: Optional[EngineStats] = None
        self.last: Optional[EngineStats] = None

    def new_incarnation(self) -> None:
        if self.base is not None and self.last is not None:
            for k in COUNTERS:
                self.carried[k] += getattr(self.last, k) - getattr(self.base, k)
        self.base = self.last = None

    def observe(self, s: EngineStats) -> None:
        if self.base is None:
            self.base = s
        self.last = s

    def view(
        self, extra_requeued: int, healthy: bool, extra_cancelled: int = 0
    ) -> Optional[EngineStats]:
        """extra_*: what the link itself did for this engine (requeued its lost work, dropped
        requests taken for it whose callers had left)."""
        if self.last is None:
            return None
        job = {k: self.carried[k] + getattr(self.last, k) - getattr(self.base, k) for k in COUNTERS}
        job["requests_requeued"] += extra_requeued
        job["requests_cancelled"] += extra_cancelled
        return replace(self.last, **job, healthy=self.last.healthy and healthy)
