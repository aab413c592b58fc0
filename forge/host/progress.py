"""What an admission runtime reads from its engine's progress over time: whether it has stalled
(StallWatch) and how fast it delivers (DeliveryRate). Pure state machines over a clock the caller
passes in."""
from __future__ import annotations

from typing import Optional


class StallWatch:
    """Work owed by the engine and no token for `window_s` = a stall.

    First window without progress: "pause" (the progress-only step: admission stops). A second
    window still without progress: "take_back" the youngest request, then one more every
    `takeback_interval_s` while nothing moves. Nothing left to take back and still silent: "wedged".
    Any progress clears it."""

    def __init__(self, window_s: float, takeback_interval_s: float, now: float):
        self.window_s, self.takeback_interval_s = window_s, takeback_interval_s
        self.state: Optional[str] = None        # None | "stalled" | "wedged"
        self._last_progress = now
        self._next_takeback = 0.0

    def progress(self, now: float) -> Optional[str]:
        """Tokens or results arrived. Returns the state that just ended (None if there was none)."""
        self._last_progress = now
        ended, self.state = self.state, None
        return ended

    def check(self, now: float, *, owed: bool, can_take_back: bool) -> Optional[str]:
        """The action due now: None | "pause" | "take_back" | "wedged"."""
        if not owed:
            self._last_progress = now            # the engine owes nothing: silence is not a stall
            return None
        if now - self._last_progress < self.window_s or self.state == "wedged":
            return None
        if self.state is None:
            self.state, self._next_takeback = "stalled", now + self.window_s
            return "pause"
        if now < self._next_takeback:
            return None
        if can_take_back:
            self._next_takeback = now + self.takeback_interval_s
            return "take_back"
        self.state = "wedged"
        return "wedged"

    def skip(self, paused_s: float, now: float) -> None:
        """The process was stopped for `paused_s` (before `now`): the engine's silence and the next
        take-back move on by as much (a stop longer than the window is not a stall)."""
        if paused_s > 0:
            self._last_progress = min(self._last_progress + paused_s, now)
            self._next_takeback += paused_s

    def silent_for(self, now: float) -> float:
        return now - self._last_progress


class DeliveryRate:
    """Delivered tokens per second: a time-weighted EWMA over the intervals between deliveries,
    counting only time with work in flight (an idle engine is not a slow one). `tokens_per_s` counts
    prompt and generated tokens (the broker's balancing signal: the work a card does);
    `generated_per_s` the generated ones alone, with the same weights (what `forge status` shows as
    tok/s)."""

    def __init__(self, half_life_s: float):
        self.half_life_s = half_life_s
        self.tokens_per_s = 0.0
        self.generated_per_s = 0.0
        self._last = 0.0
        self._busy_since: Optional[float] = None

    def busy(self, now: float) -> None:
        if self._busy_since is None:
            self._busy_since = now

    def idle(self) -> None:
        self._busy_since = None

    def delivered(self, tokens: int, now: float, generated: int = 0) -> float:
        """Record a delivery of `tokens` (prompt + generated), `generated` of them generated;
        returns the interval it covers (what the broker's balancer is told)."""
        elapsed = max(
            now - max(self._last, self._busy_since if self._busy_since is not None else now), 1e-6
        )
        self._last = now
        # The first sample is taken as is: an EWMA starting at 0 would read low for many half-lives.
        weight = 1.0 - 0.5 ** (elapsed / self.half_life_s) if self.tokens_per_s else 1.0
        self.tokens_per_s += weight * (tokens / elapsed - self.tokens_per_s)
        self.generated_per_s += weight * (generated / elapsed - self.generated_per_s)
        return elapsed


class Occupancy:
    """The time-weighted share of the engine's binding resource in use between two deliveries (slots
    or KV blocks, whichever is fuller), over busy time only. The broker divides a delivery by it: a
    batcher delivers in proportion to what it holds, so a card measured half idle would read as half
    as fast."""

    def __init__(self):
        self._share = 0.0
        self._since: Optional[float] = None
        self._area = self._span = 0.0

    def set(self, now: float, share: float) -> None:
        """What is in use changed to `share` (0..1) at `now`."""
        if self._since is not None and self._share > 0:
            self._area += self._share * (now - self._since)
            self._span += now - self._since
        self._since, self._share = now, min(1.0, max(0.0, share))

    def take(self, now: float) -> float:
        """The mean share since the last take; 1.0 when no busy time passed."""
        self.set(now, self._share)
        mean = self._area / self._span if self._span > 0 else 1.0
        self._area = self._span = 0.0
        return mean
