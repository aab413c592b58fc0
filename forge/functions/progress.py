"""Live progress: a rich bar on a terminal, plain periodic lines otherwise (logs, CI, pipes)."""
from __future__ import annotations

import sys
import time
from typing import Optional

from forge.stats import RunStats

LINE_INTERVAL_S = 10.0
BAR_WIDTH = 12


def _rates(stats: RunStats) -> tuple[float, float, float]:
    """Generated tokens/s, prompt tokens/s and records settled/s since the run started."""
    elapsed = max(time.time() - stats.started_at, 1e-9)
    return (
        stats.output_tokens / elapsed,
        stats.input_tokens / elapsed,
        (stats.done + stats.failed) / elapsed,
    )


def _eta(stats: RunStats) -> str:
    rps = _rates(stats)[2]
    left = stats.total - stats.done - stats.failed - stats.skipped
    if rps <= 0 or stats.total <= 0:
        return "?"
    return _clock(left / rps)


def _clock(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def token_rates(stats: RunStats) -> str:
    """Generated tokens/s first (what engines and their benchmarks call tok/s), prompt tokens/s
    beside it."""
    gen, prompt, _ = _rates(stats)
    return f"generated {gen:,.0f} tok/s · prompt {prompt:,.0f} tok/s"


def status_line(stats: RunStats) -> str:
    settled = stats.done + stats.failed + stats.skipped
    total = stats.total or "?"
    return (f"{token_rates(stats)} | records {settled}/{total} done (failed {stats.failed}, "
            f"resumed {stats.skipped}) "
            f"| in flight {stats.in_flight} records, {stats.calls_in_flight} calls | "
            f"elapsed {_clock(time.time() - stats.started_at)} | ETA {_eta(stats)}")


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
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress as RichProgress,
                TextColumn,
            )
            from rich.table import Column

            # One text after the records done, most telling first: a narrow terminal cuts it at its
            # end, and keeps the name, the bar and the records whole (rich squeezes every column
            # alike unless told a width).
            console = Console(file=self.stream)
            done_width = 2 * len(f"{self.stats.total or 0:,}") + 1
            room = max(20, console.width - len(self.label) - BAR_WIDTH - done_width - 3)
            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=BAR_WIDTH),
                MofNCompleteColumn(),
                TextColumn(
                    "{task.fields[info]}",
                    table_column=Column(no_wrap=True, overflow="ellipsis", max_width=room),
                ),
                console=console,
                refresh_per_second=4,
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.stats.total or None, info="")
        return self

    def update(self, now: Optional[float] = None) -> None:
        now = now or time.time()
        if self.mode == "bar" and self._bar is not None:
            st = self.stats
            gen, prompt, _ = _rates(st)
            settled = st.done + st.failed + st.skipped
            failed = f" · failed {st.failed}" if st.failed else ""
            self._bar.update(self._task, completed=settled, total=st.total or None,
                             info=f"generated {gen:,.0f} tok/s · {st.calls_in_flight} calls in "
                                  "flight · elapsed "
                                  f"{_clock(time.time() - st.started_at)}{failed} · ETA {_eta(st)} "
                                  "· "
                                  f"{st.in_flight} records in flight · prompt {prompt:,.0f} tok/s")
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
