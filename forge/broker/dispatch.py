"""Dispatch choices: measured speed, load, bounded-load affinity, finishing time (docs/broker.md).

Work is counted in tokens (prompt + max_new_tokens), the same unit engines report as delivered, so
an engine's load divided by its measured tokens/s reads as "seconds of work it holds"."""
from __future__ import annotations

import math
from typing import Sequence

from forge.broker.types import EngineGeometry

DEFAULT_SPEED_HALF_LIFE_S = 5.0  # a delivery sample this old weighs half as much in the speed EWMA
DEFAULT_TAIL_SLACK = 0.25        # tail: defer to an engine only if it finishes > 25 % sooner
LN2 = math.log(2.0)


class Balancer:
    """Per-engine speed, outstanding work, pinned backlog and health; all O(engines) or O(1)."""

    def __init__(
        self,
        engines: Sequence[EngineGeometry],
        *,
        affinity_load_factor: float,
        tail_slack: float,
        half_life_s: float = DEFAULT_SPEED_HALF_LIFE_S,
    ):
        if affinity_load_factor < 1.0:
            raise ValueError(f"affinity_load_factor must be >= 1, got {affinity_load_factor}")
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        n = len(engines)
        self.ids = [g.engine_id for g in engines]
        self.slots = [g.max_batch_size for g in engines]
        # Before any delivery is measured an engine's speed is assumed proportional to its token
        # budget: the contract's statement of how much work it takes per step.
        self.prior = [float(g.max_num_tokens) for g in engines]
        self.factor = affinity_load_factor
        if tail_slack < 0:
            raise ValueError(f"tail_slack must be >= 0, got {tail_slack}")
        self.tail_slack = tail_slack
        self.half_life_s = half_life_s
        self.rate: list = [None] * n            # EWMA of delivered tokens/s, None until measured
        # The EWMA starts at 0 and is divided by the weight it has gathered (1 - 0.5 ** (measured s
        # / half-life)): early on it is the time-weighted mean of the samples so far, not the first
        # sample alone.
        self._ewma = [0.0] * n
        self._mass = [0.0] * n
        self.healthy = [True] * n
        self.out_work = [0] * n                 # tokens of work taken and not yet done
        self.out_n = [0] * n
        self.pinned_work = [0] * n  # tokens pending in prefix groups pinned to the engine
        self.pinned_n = [0] * n     # requests pending in those groups
        self.pending_work = 0       # tokens pending in the whole broker
        # Dispatches since the last arrival: past `tail_after` the job's input has stopped and the
        # end of the run is in view (see allows()); while requests keep arriving there is no tail to
        # shorten.
        self.tail_after = 2 * n
        self.quiet = self.tail_after
        self._refresh()

    # ------------------------------------------------------------------ speed
    def record(self, i: int, tokens: int, elapsed_s: float, occupancy: float = 1.0) -> None:
        """A delivery sample: `tokens` over `elapsed_s` busy seconds with `occupancy` of the slots
        in use on average. An engine's speed is what it delivers with every slot busy: a batcher
        delivers in proportion to the requests it holds, so a card measured while half idle would
        otherwise read as half as fast, get less work, and read slower still."""
        if elapsed_s <= 0 or tokens < 0:
            return
        occupancy = min(1.0, max(occupancy, 1.0 / self.slots[i]))     # busy means at least one slot
        sample = tokens / (elapsed_s * occupancy)
        # Bias-corrected, not seeded with the first sample: deliveries are counted when requests
        # finish, so a card's first sample (from the moment it got work to its first answer) reads a
        # fraction of its speed. Taken as is, it stayed for half-lives: cards at 3:1 were weighed
        # 8:1 a second into a 4 s run, the finishing-time rule starved the slow one, and the fast
        # card took 80 % (forge bench scaling, docs/broker.md).
        alpha = -math.expm1(-LN2 * elapsed_s / self.half_life_s)  # 1 - 0.5 ** (elapsed / half-life)
        self._ewma[i] += alpha * (sample - self._ewma[i])
        self._mass[i] += alpha * (1.0 - self._mass[i])
        self.rate[i] = self._ewma[i] / self._mass[i] if self._mass[i] > 0 else sample
        self._refresh()

    def set_healthy(self, i: int, healthy: bool) -> None:
        self.healthy[i] = healthy
        self._refresh()

    def _refresh(self) -> None:
        """Recompute the speed weights: measured rates, and for engines not yet measured their prior
        scaled by what the measured engines deliver per unit of prior."""
        measured = [i for i, r in enumerate(self.rate) if r is not None and r > 0]
        scale = (
            (sum(self.rate[i] for i in measured) / sum(self.prior[i] for i in measured))
            if measured
            else 1.0
        )
        w = []
        for i, r in enumerate(self.rate):
            w.append(r if (r is not None and r > 0) else self.prior[i] * scale)
        self.weight = w
        live = [i for i in range(len(w)) if self.healthy[i]]
        self.live = live
        self.weight_live = sum(w[i] for i in live) or 1.0

    # ------------------------------------------------------------------ load and affinity
    def total_work(self) -> float:
        """Work held by healthy engines plus everything pending: what the engines must get
        through."""
        return sum(self.out_work[i] for i in self.live) + self.pending_work

    def mean_load(self) -> float:
        return self.total_work() / self.weight_live

    def load(self, i: int) -> float:
        return (self.out_work[i] + self.pinned_work[i]) / self.weight[i]

    def _past_bound(self, i: int, extra_work: float, extra_n: int) -> float:
        """> 0 when engine i (with extra pinned work) is past factor x mean load AND holds more
        requests than its slots: a backlog it cannot even admit. The second clause is the integer
        slack of bounded-load hashing: an owner that will admit all its work at its next take is
        never loaded."""
        if self.out_n[i] + self.pinned_n[i] + extra_n <= self.slots[i]:
            return -1.0
        return self.load(i) + extra_work / self.weight[i] - self.factor * self.mean_load()

    def may_claim(self, i: int, extra_work: float = 0.0, extra_n: int = 0) -> bool:
        """Bounded load: an engine pins a prefix group (carrying that pending work) only while, with
        it, it stays within its bound."""
        return self._past_bound(i, extra_work, extra_n) <= 0

    def backlog_s(self, j: int) -> float:
        """Seconds engine j needs to get through what it holds and what is pinned to it, at its
        speed."""
        return (self.out_work[j] + self.pinned_work[j]) / self.weight[j]

    def sooner(self, i: int, j: int, work: int) -> bool:
        """Work-conserving spill: would engine i finish `work` before owner j gets through its
        backlog? Then leaving it pinned to j only keeps i's slots idle (a slow card holding a
        group's overflow, or a fast owner of a hot group starving a slow card that has free slots).
        While requests keep arriving, also whenever j holds more than it can start now: free slots
        idle for as long as the stream lasts."""
        if self.finish(i, work) < self.backlog_s(j):
            return True
        return self.quiet < self.tail_after and self.out_n[j] + self.pinned_n[j] > self.slots[j]

    def overloaded(self, i: int) -> float:
        """How far engine i is past its bound (> 0: others may spill its pinned groups); unhealthy =
        inf."""
        if not self.healthy[i]:
            return float("inf")
        return self._past_bound(i, 0.0, 0)

    # ------------------------------------------------------------------ finishing time
    def finish(self, i: int, work: int) -> float:
        """Seconds until engine i would finish `work` taken now: the longer of running it in one
        slot (work x slots / speed) and getting through what it holds plus this ((outstanding +
        work) / speed)."""
        return max(work * self.slots[i], self.out_work[i] + work) / self.weight[i]

    def drain_limit(self) -> float:
        """(1 + slack) x the time the healthy engines need for what they hold (on average half done)
        and everything pending, at their measured speeds. A request an engine would finish within it
        does not make the run end later."""
        held = sum(self.out_work[i] for i in self.live)
        return (1.0 + self.tail_slack) * (0.5 * held + self.pending_work) / self.weight_live

    def allows(self, i: int, work: int, mask: int, drain_limit: float) -> bool:
        """May engine i take `work` (what it took earlier in this batch already counts)?

        Yes if it would finish within the drain limit — always so while a backlog lasts. In the
        tail, only if no other healthy engine that fits the request would finish it sooner by more
        than the slack: a slow card stops taking work a fast card would finish first. The engine
        with the earliest finish always qualifies, so no request is left without a taker. The tail
        is the end of the work: while requests still arrive (a function pool refilling the node as
        results come back, so that only a window of the job is ever pending), refusing a card's free
        slots would only idle it for as long as the stream lasts."""
        mine = self.finish(i, work)
        if mine <= drain_limit or self.quiet < self.tail_after:
            return True
        limit = mine / (1.0 + self.tail_slack)
        for j in self.live:
            if j != i and (mask >> j) & 1 and self.finish(j, work) < limit:
                return False
        return True

    def lags(self, j: int, work: float, drain_limit: float) -> bool:
        """Would engine j finish `work` after the drain limit (so a faster engine may take it
        over)?"""
        return self.finish(j, work) > drain_limit

    def faster(self, i: int, j: int, work: int) -> bool:
        """Would engine i finish `work` sooner than engine j by more than the slack?"""
        return self.finish(i, work) * (1.0 + self.tail_slack) < self.finish(j, work)

    # ------------------------------------------------------------------ bookkeeping
    def taken(self, i: int, work: int) -> None:
        self.out_work[i] += work
        self.out_n[i] += 1
        self.pending_work -= work
        self.quiet += 1

    def arrived(self) -> None:
        self.quiet = 0

    def finished(self, i: int, work: int) -> None:
        self.out_work[i] -= work
        self.out_n[i] -= 1

    def snapshot(self) -> dict[str, dict]:
        return {
            eid: {
                "tokens_per_s": self.rate[i],
                "weight": self.weight[i],
                "healthy": self.healthy[i],
                "outstanding_requests": self.out_n[i],
                "outstanding_work": self.out_work[i],
                "pinned_pending_work": self.pinned_work[i],
                "pinned_pending_requests": self.pinned_n[i],
            }
            for i, eid in enumerate(self.ids)
        }
