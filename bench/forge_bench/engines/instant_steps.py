"""The `instant` backend's step model (`instant: {step_cpu_ms: X}`): a continuous batcher whose
every step spends X ms of pure-Python CPU time while holding the GIL, as transformers'
continuous-batching loop does, so contention between engines and forge's control plane shows on CPUs
without a model.

A step works like a real batcher's: every request past its prompt decodes one token, then prompts
are prefilled in arrival order in chunks, all within the contract's token budget
(`limits.max_num_tokens`); the batch is every request the engine holds (at most
`limits.max_batch_size`, the slots). So a card's speed is set by (CPU per step, tokens per step): a
full decode batch of 32 slots at 4 ms per step is 8,000 output tokens/s on a core of its own. With
`kv_cache.block_reuse`, a prompt's leading full blocks that an earlier prompt already brought into
the cache (an LRU of chain hashes bounded by the pool's block count) are not prefilled again; the
engine counts them as prefix hits, like a real one.

The spin reads the thread's own CPU clock, not the wall clock: a step is a fixed amount of Python
work whatever else runs, so sharing one interpreter (or one core) with other busy threads makes it
take longer in wall time, which is the contention this exists to show."""
from __future__ import annotations

import time
from typing import Protocol, Sequence

from forge.prefix_blocks import BlockMirror, chain_hashes

SPIN_CHUNK = 64                   # bytecode iterations between reads of the thread's CPU clock


def spin(cpu_s: float) -> int:
    """Run Python bytecode until this thread has used `cpu_s` seconds of CPU (the GIL is held
    throughout, except where the interpreter hands it to another thread at its switch interval)."""
    clock = time.thread_time
    end = clock() + cpu_s
    n = 0
    while clock() < end:
        for _ in range(SPIN_CHUNK):
            n += 1
    return n


class StepJob(Protocol):
    prompt_len: int
    cost: int                     # prompt + max_new_tokens
    spent: int                    # tokens done so far (prefix hits count as done)


class StepBatcher:
    def __init__(
        self,
        *,
        cpu_ms: float,
        token_budget: int,
        tokens_per_block: int,
        cache_blocks: int,
        block_reuse: bool,
    ):
        self.cpu_s = cpu_ms / 1000.0
        self.budget = token_budget
        self.tpb = tokens_per_block
        self._cache = BlockMirror(cache_blocks) if block_reuse else None
        self.steps = 0
        self.last_step_tokens = 0
        self.prefix_hit_tokens = 0

    def admit(self, job: StepJob, prompt: Sequence[int]) -> None:
        """A new request: the leading blocks of its prompt already cached are done (at least one
        prompt token is always computed, as engines do)."""
        if self._cache is None:
            return
        hit = self._cache.dispatch(chain_hashes(tuple(prompt), self.tpb)) * self.tpb
        hit = min(hit, max(job.prompt_len - 1, 0))
        job.spent = hit
        self.prefix_hit_tokens += hit

    def step(self, jobs: Sequence[StepJob]) -> int:
        """One engine step over `jobs` (arrival order); returns the output tokens it produced."""
        spin(self.cpu_s)
        left = self.budget
        produced = 0
        for j in jobs:  # decode: one token for each request past its prompt
            if left <= 0:
                break
            if j.prompt_len <= j.spent < j.cost:
                j.spent += 1
                left -= 1
                produced += 1
        for j in jobs:                                     # prefill: chunks in arrival order
            if left <= 0:
                break
            todo = j.prompt_len - j.spent
            if todo > 0:
                take = min(todo, left)
                j.spent += take
                left -= take
        self.steps += 1
        self.last_step_tokens = self.budget - left
        return produced
