"""A synthetic two-card run, driven by a fake clock: the stats objects a real node would hand
out."""
from __future__ import annotations

import math
import random

from forge.stats import BrokerStats, EngineStats, LedgerStats, RunStats

NODE = "fabric-a"
CARDS = (  # card, tier, budget, slots, kv blocks, steady tokens/s
    ("gpu0", "llama7b-fp8-1k", 8192, 256, 4096, 100_000.0),
    ("gpu1", "llama7b-fp8-1k-half", 4096, 128, 2048, 60_000.0),
)
STALL = (300.0, 330.0)   # gpu1 makes no progress in this window, then takes a progress-only step
END_S = 600.0


class SyntheticRun:
    def __init__(self, seed: int = 7):
        self.rng = random.Random(seed)
        self.t0 = 1_700_000_000.0
        self.now = self.t0
        self.engines = {c[0]: EngineStats(NODE, c[0], c[1], c[2], c[3], c[4]) for c in CARDS}
        self.broker = BrokerStats(NODE)
        self.run = RunStats(total=200_000, started_at=self.t0)
        self.ledger = LedgerStats()

    def _load(self, t: float) -> float:
        """0..1: ramp up for 20 s, steady, tail from 540 s."""
        return min(1.0, t / 20.0) * (1.0 if t < 540 else max(0.05, (END_S - t) / 60.0))

    def advance(self, dt: float) -> None:
        self.now += dt
        t = self.now - self.t0
        load = self._load(t)
        for card, tier, budget, slots, blocks, speed in CARDS:
            s = self.engines[card]
            stalled = card == "gpu1" and STALL[0] <= t < STALL[1]
            rate = (
                0.0
                if stalled
                else speed * load * (1 + 0.08 * math.sin(t / 7) + self.rng.gauss(0, 0.03))
            )
            tokens = int(rate * dt)
            s.input_tokens += int(tokens * 0.88)
            s.output_tokens += tokens - int(tokens * 0.88)
            s.prefix_hit_tokens += int(tokens * 0.88 * 0.4)
            s.requests_ok += tokens // 1000
            s.in_flight = slots if stalled else int(slots * load * (0.9 + 0.05 * self.rng.random()))
            s.engine_queued = self.rng.randint(0, 8) if load > 0.5 else 0
            s.tokens_last_step = (
                0 if stalled else int(budget * load * (0.75 + 0.1 * self.rng.random()))
            )
            computed = tokens - int(tokens * 0.88 * 0.4)       # prefix hits are not recomputed
            s.engine_steps += round(computed / s.tokens_last_step) if s.tokens_last_step else 0
            s.kv_blocks_reserved = int(blocks * 0.92 * load)
            s.kv_blocks_used = int(s.kv_blocks_reserved * (0.85 + 0.05 * self.rng.random()))
            s.kv_blocks_free = blocks - s.kv_blocks_used
            s.tokens_per_s = rate
            s.timestamp = self.now
            if stalled and s.stalls == 0:
                s.stalls = 1
            if card == "gpu1" and t >= STALL[1] and s.progress_only_steps == 0:
                s.progress_only_steps, s.requests_requeued = 1, 12
        done = sum(s.requests_ok for s in self.engines.values())
        self.run.done = min(self.run.total, done)
        self.run.input_tokens = sum(s.input_tokens for s in self.engines.values())
        self.run.output_tokens = sum(s.output_tokens for s in self.engines.values())
        self.run.in_flight = sum(s.in_flight for s in self.engines.values()) + 40
        self.run.producer_queue = int(1024 * load * self.rng.random())
        self.run.writer_queue = self.rng.randint(0, 50)
        self.broker.pending = int(20_000 * max(0.0, 1 - t / 560))
        self.broker.prompt_tokens = self.run.input_tokens
        self.broker.shared_prefix_tokens = int(self.run.input_tokens * 0.42)
        self.broker.batch_tokens = int(self.run.input_tokens * 1.05)
        self.broker.padded_tokens = self.broker.batch_tokens - self.run.input_tokens
        self.broker.dispatched = done + self.run.in_flight
        self.ledger.commits += 20
        self.ledger.rows_committed = self.run.done
        self.ledger.last_commit_s = 0.002 + 0.001 * self.rng.random()
        self.ledger.total_commit_s += 20 * self.ledger.last_commit_s

    def sources(self) -> dict:
        return {"engines": lambda: list(self.engines.values()), "broker": lambda: self.broker,
                "run": lambda: self.run, "ledger": lambda: self.ledger}


def drive(sampler, sim: SyntheticRun, until_s: float = END_S) -> None:
    """What Sampler.run does, on the fake clock: sample, wait one stride, repeat."""
    sampler.sample(sim.now)
    while sim.now - sim.t0 < until_s:
        sim.advance(sampler.stride_s)
        sampler.sample(sim.now)
