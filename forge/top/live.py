"""Paces the polls and draws frames: redrawn in place on a terminal, frame after frame on a pipe,
exactly one with --once. A node that stops answering is shown as such for a few polls, then
`forge top` exits with one line (a node that never answered: at once)."""
from __future__ import annotations

import time
from typing import Callable, Optional

from rich.console import Console, RenderableType

from forge.top.poll import NodeUnreachable, Poller, Sample
from forge.top.view import Frame, render

MAX_MISSED_POLLS = 3


def run_once(poller: Poller, console: Console, interval_s: float) -> int:
    """Two samples one interval apart (so rates are measured, not guessed), one frame, done."""
    first = poller.sample()
    time.sleep(interval_s)
    second = poller.sample()
    console.print(render(Frame(poller.url, second.health, second.stats, first.stats, interval_s)))
    return 0


def _loop(poller: Poller, draw: Callable[[RenderableType], None], interval_s: float, hint: str,
          max_frames: Optional[int]) -> int:
    cur: Sample = poller.sample()
    prev: Optional[Sample] = None
    missed, problem, frames = 0, None, 0
    next_at = time.monotonic()
    while max_frames is None or frames < max_frames:
        draw(
            render(
                Frame(
                    poller.url,
                    cur.health,
                    cur.stats,
                    prev.stats if prev else None,
                    interval_s,
                    problem=problem,
                    hint=hint,
                )
            )
        )
        frames += 1
        # a slow poll delays; it never bunches up
        next_at = max(next_at + interval_s, time.monotonic())
        time.sleep(max(0.0, next_at - time.monotonic()))
        try:
            sample = poller.sample()
        except NodeUnreachable as e:
            missed += 1
            if missed >= MAX_MISSED_POLLS:
                raise NodeUnreachable(f"{poller.label} stopped answering ({missed} polls in a "
                                      f"row): {e.reason}",
                                      e.reason) from None
            problem = (f"no answer: {e.reason} (showing the last one; retry "
                       f"{missed}/{MAX_MISSED_POLLS - 1})")
            continue
        prev, cur, missed, problem = cur, sample, 0, None
    return 0


def run_live(
    poller: Poller, console: Console, interval_s: float, max_frames: Optional[int] = None
) -> int:
    """Until Ctrl-C (KeyboardInterrupt propagates; the caller turns it into exit 0)."""
    if not console.is_terminal:
        def print_frame(r: RenderableType) -> None:
            console.print(r)
            console.print()
        return _loop(poller, print_frame, interval_s, "", max_frames)
    from rich.live import Live

    with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
              redirect_stderr=False) as live:
        return _loop(
            poller, lambda r: live.update(r, refresh=True), interval_s, "Ctrl-C quits", max_frames
        )
