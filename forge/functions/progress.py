"""Live progress: a rich bar on a terminal, plain periodic lines otherwise (logs, CI, pipes)."""
from __future__ import annotations

import sys
import time
from typing import Optional

from forge.stats import RunStats

LINE_INTERVAL_S = 10.0


def _rate(stats: RunStats) -> tuple[float, float]:
    elapsed = max(time.time() - stats.started_at, 1e-9)
    return (stats.input_tokens + stats.output_tokens) / elapsed, (stats.done + stats.failed) / elapsed


def _eta(stats: RunStats) -> str:
    _, rps = _rate(stats)
    left = stats.total - stats.done - stats.failed - stats.skipped
    if rps <= 0 or stats.total <= 0:
        return "?"
    return _clock(left / rps)


def _clock(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def status_line(stats: RunStats) -> str:
    tps, _ = _rate(stats)
    settled = stats.done + stats.failed + stats.skipped
    total = stats.total or "?"
    return (f"records {settled}/{total} (failed {stats.failed}, resumed {stats.skipped}) | "
            f"{tps:,.0f} tok/s | in flight {stats.in_flight} | elapsed {_clock(time.time() - stats.started_at)} | "
            f"ETA {_eta(stats)}")


class Progress:
    def __init__(self, mode: str, stats: RunStats, *, label: str = "forge", stream=None):
        self.stats = stats
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode
        self.label = label
        self._bar = None
        self._task = None
        self._last_line = 0.0

    def __enter__(self) -> "Progress":
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                TimeElapsedColumn

            self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[info]} · elapsed"), TimeElapsedColumn(),
                                     console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.stats.total or None, info="")
        return self

    def update(self, now: Optional[float] = None) -> None:
        now = now or time.time()
        if self.mode == "bar" and self._bar is not None:
            tps, _ = _rate(self.stats)
            settled = self.stats.done + self.stats.failed + self.stats.skipped
            self._bar.update(self._task, completed=settled, total=self.stats.total or None,
                             info=f"{tps:,.0f} tok/s · in flight {self.stats.in_flight} · "
                                  f"failed {self.stats.failed} · ETA {_eta(self.stats)}")
        elif self.mode == "lines" and now - self._last_line >= LINE_INTERVAL_S:
            self._last_line = now
            print(f"{self.label}: {status_line(self.stats)}", file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self.update()
            self._bar.__exit__(*exc)
        elif self.mode == "lines":
            self._last_line = 0.0
            self.update()
