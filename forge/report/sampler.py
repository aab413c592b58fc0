"""Bounded time series of a run, sampled from the same stats objects the metrics module reads.

The runner hands the Sampler callables that return the current stats objects; `run()` samples them
every `stride_s` as an asyncio task (and `sample()` does one sample, for tests and for the final
snapshot). Memory is bounded: past `max_points` samples, adjacent pairs are merged and the stride
doubles, so a ten-hour run keeps the same number of points as a ten-minute one. Cumulative
counters keep the later value of a pair (rates between kept points stay exact); gauges keep the
pair's mean."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from forge.stats import BrokerStats, EngineStats, LedgerStats, RunStats

DEFAULT_MAX_POINTS = 2048
# a run of a second still has points to plot; long runs thin out (max_points)
DEFAULT_INTERVAL_S = 0.25

# field -> "counter" (cumulative) | "gauge" (instantaneous)
CARD_FIELDS = {
    "input_tokens": "counter", "output_tokens": "counter", "engine_steps": "counter",
    "stalls": "counter", "progress_only_steps": "counter",
    "in_flight": "gauge", "engine_queued": "gauge", "kv_blocks_used": "gauge",
    "kv_blocks_reserved": "gauge", "tokens_last_step": "gauge",
}
RUN_FIELDS = {
    "done": "counter", "failed": "counter", "skipped": "counter", "retried": "counter",
    "input_tokens": "counter", "output_tokens": "counter",
    "in_flight": "gauge", "producer_queue": "gauge", "writer_queue": "gauge",
}
BROKER_FIELDS = {
    "prompt_tokens": "counter", "shared_prefix_tokens": "counter", "padded_tokens": "counter",
    "batch_tokens": "counter", "pending": "gauge",
}

Value = Optional[float]


def _merge(kind: str, a: Value, b: Value) -> Value:
    if kind == "counter":
        return b if b is not None else a
    present = [v for v in (a, b) if v is not None]
    return sum(present) / len(present) if present else None


def _halve(values: list[Value], kind: str) -> list[Value]:
    merged = [_merge(kind, values[i], values[i + 1]) for i in range(0, len(values) - 1, 2)]
    if len(values) % 2:
        merged.append(values[-1])
    return merged


@dataclass
class SeriesGroup:
    """Columns of one source (a card, the run, the broker), aligned with the sampler's clock."""

    kinds: dict[str, str]
    columns: dict[str, list[Value]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.kinds:
            self.columns.setdefault(name, [])

    def append(self, stats: Any, length_before: int) -> None:
        for name, col in self.columns.items():
            col.extend([None] * (length_before - len(col)))   # a source that appeared late
            col.append(None if stats is None else float(getattr(stats, name)))

    def halve(self) -> None:
        for name, col in self.columns.items():
            self.columns[name] = _halve(col, self.kinds[name])


class Sampler:
    """Samples the run's stats objects into bounded series; optionally feeds a ForgeMetrics too."""

    def __init__(self, *, engines: Callable[[], Sequence[EngineStats]] | None = None,
                 broker: Callable[[], BrokerStats | None] | None = None,
                 run: Callable[[], RunStats | None] | None = None,
                 ledger: Callable[[], LedgerStats | None] | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, max_points: int = DEFAULT_MAX_POINTS,
                 metrics: Any = None, node: str = "", function: str = ""):
        if interval_s <= 0 or max_points < 4:
            raise ValueError("Sampler needs interval_s > 0 and max_points >= 4")
        self._sources = {"engines": engines, "broker": broker, "run": run, "ledger": ledger}
        self.stride_s = float(interval_s)
        self.max_points = max_points
        self.metrics = metrics                       # a forge.metrics.ForgeMetrics, or None
        self.node, self.function = node, function
        self.times: list[float] = []                 # unix seconds of each kept point
        self.cards: dict[str, SeriesGroup] = {}      # "node/card" -> series
        self.card_meta: dict[str, dict[str, Any]] = {}
        self.run_series = SeriesGroup(RUN_FIELDS)
        self.broker_series = SeriesGroup(BROKER_FIELDS)
        self.last_engines: dict[str, EngineStats] = {}
        self.last_broker: BrokerStats | None = None
        self.last_run: RunStats | None = None
        self.last_ledger: LedgerStats | None = None
        self.errors = 0
        self.last_error: str | None = None

    def _read(self, name: str) -> Any:
        source = self._sources[name]
        if source is None:
            return None
        try:
            return source()
        except Exception as e:  # a broken stats source must not take the run down; it is reported
            self.errors += 1
            self.last_error = f"{name}: {type(e).__name__}: {e}"
            return None

    def sample(self, now: float | None = None, *, force: bool = False) -> bool:
        """Read every source (the latest snapshots always update `last_*`, the report's totals) and
        append a point when a stride has passed since the last one, or when forced (the final
        sample). Merges old points when full. Returns whether a point was appended."""
        now = time.time() if now is None else now
        engines = list(self._read("engines") or [])
        broker, run, ledger = self._read("broker"), self._read("run"), self._read("ledger")
        if self.metrics is not None:
            self._feed_metrics(engines, broker, run, ledger)
        for s in engines:
            self.last_engines[f"{s.node}/{s.card}"] = s
        self.last_broker = broker if broker is not None else self.last_broker
        self.last_run = run if run is not None else self.last_run
        self.last_ledger = ledger if ledger is not None else self.last_ledger
        if self.times and (
            now <= self.times[-1] or (not force and now - self.times[-1] < self.stride_s * 0.999)
        ):
            return False
        n = len(self.times)
        seen = set()
        for s in engines:
            key = f"{s.node}/{s.card}"
            seen.add(key)
            self.card_meta[key] = {
                "node": s.node,
                "card": s.card,
                "tier": s.tier,
                "token_budget": s.token_budget,
                "slots": s.slots,
                "kv_blocks_total": s.kv_blocks_total,
            }
            self.cards.setdefault(key, SeriesGroup(CARD_FIELDS)).append(s, n)
        for key, group in self.cards.items():
            if key not in seen:
                group.append(None, n)
        self.run_series.append(run, n)
        self.broker_series.append(broker, n)
        self.times.append(now)
        if len(self.times) > self.max_points:
            self._halve()
        return True

    def _halve(self) -> None:
        self.times = _halve(self.times, "counter")   # a merged point sits at the later time
        for group in (*self.cards.values(), self.run_series, self.broker_series):
            group.halve()
        self.stride_s *= 2

    def _feed_metrics(self, engines, broker, run, ledger) -> None:
        self.metrics.observe_engines(engines)
        if broker is not None:
            self.metrics.observe_broker(broker)
        node = self.node or (broker.node if broker is not None else "")
        if run is not None:
            self.metrics.observe_run(run, {"node": node, "function": self.function})
        if ledger is not None:
            self.metrics.observe_ledger(ledger, node=node)

    async def run(self) -> None:
        """Sample every stride until cancelled; `write_report` takes the final sample."""
        while True:
            self.sample()
            await asyncio.sleep(self.stride_s)

    def series(self, started_at: float | None = None) -> dict[str, Any]:
        """The series as JSON-ready data: times relative to `started_at` (default: first sample)."""
        origin = started_at if started_at is not None else (self.times[0] if self.times else 0.0)
        return {
            "stride_s": self.stride_s,
            "t_s": [round(t - origin, 3) for t in self.times],
            "run": self.run_series.columns,
            "broker": self.broker_series.columns,
            "cards": [
                {**self.card_meta[key], "series": group.columns}
                for key, group in self.cards.items()
            ],
        }
