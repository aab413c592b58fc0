"""A warm-up at load: the engine's first full-size steps, run before its card reports ready.

A fresh process pays one-time costs in its first steps at a new size: the CUDA caching allocator
grows to its peak, the kernels' per-shape choices are made. transformers' own `warmup()` runs steps
only when it captures CUDA graphs or compiles, and a card worker is a fresh process for every
engine, so without this a job's first seconds would pay them (direct, run repeatedly in one process,
pays them once; docs/benchmarks.md, "forge ÷ direct on one card"). Two rounds of synthetic requests:
prompts that fill one step's token budget, then one short request per slot decoding a few tokens.
Bounded; a warm-up cut short is reported, never fatal."""
from __future__ import annotations

import random
import time
from typing import Any, Optional

WARM_TIMEOUT_S = 60.0          # both rounds together
DECODE_TOKENS = 4
DECODE_PROMPT_TOKENS = 16
FIRST_ORDINARY_ID = 3          # below: the usual special ids (pad, bos, eos)


def warm_up(manager: Any, *, budget: int, max_input_len: int, slots: int, vocab_size: int,
            request_kwargs: dict, timeout_s: float = WARM_TIMEOUT_S) -> Optional[str]:
    """Run the two rounds through a started manager; None when both finished, else why not."""
    rng = random.Random(0)
    deadline = time.monotonic() + timeout_s
    long_len = max(1, min(max_input_len, budget))
    rounds = [[long_len] * max(1, budget // long_len), [DECODE_PROMPT_TOKENS] * max(1, slots)]
    for n, lengths in enumerate(rounds):
        ids = []
        for i, length in enumerate(lengths):
            rid = f"forge-warmup-{n}-{i}"
            prompt = [rng.randrange(FIRST_ORDINARY_ID, vocab_size) for _ in range(length)]
            if (
                manager.add_request(
                    prompt,
                    request_id=rid,
                    max_new_tokens=1 if n == 0 else DECODE_TOKENS,
                    streaming=False,
                    eos_token_id=-1,
                    **request_kwargs,
                )
                is None
            ):
                return "the generation loop took no request"
            ids.append(rid)
        waiting = set(ids)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"{len(waiting)} warm-up request(s) unfinished after {timeout_s:g} s"
            out = manager.get_result(timeout=min(left, 0.5))
            if out is None:
                if not manager.is_running():
                    return "the generation loop stopped"
                continue
            if out.is_finished():
                waiting.discard(out.request_id)
    return None
