"""Which engines a request fits, length buckets, and the view prefix groups are keyed in."""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from typing import Optional, Sequence

from forge.broker.types import BrokerRequest, EngineGeometry, NoEngineFits, blocks_for

MIN_BUCKET_TOKENS = 16          # prompts up to this long share the first bucket


def fit_problem(req: BrokerRequest, g: EngineGeometry) -> Optional[str]:
    """Why `req` cannot run on `g`, in words with the numbers; None when it fits."""
    prompt = req.prompts.get(g.tokenizer_key)
    if prompt is None:
        return f"no prompt for its tokenizer {g.tokenizer_key!r}"
    return size_problem(len(prompt), req.max_new_tokens, g)


def size_problem(prompt_tokens: int, max_new_tokens: int, g: EngineGeometry) -> Optional[str]:
    """Why a prompt of `prompt_tokens` (in g's tokenizer) asking for `max_new_tokens` cannot run on
    `g`; None when it fits. The node's broker and an engine host's queue refuse by it."""
    n, m = prompt_tokens, max_new_tokens
    if n > g.max_input_len:
        return f"prompt {n} tokens > max_input_len {g.max_input_len}"
    if m > g.max_output_len:
        return f"max_new_tokens {m} > max_output_len {g.max_output_len}"
    blocks = blocks_for(n, m, g.tokens_per_block)
    if blocks > g.kv_blocks_total:
        return f"needs {blocks} KV blocks of {g.tokens_per_block} > the pool's {g.kv_blocks_total}"
    return None


def _shape(g: EngineGeometry) -> tuple:
    return (
        g.tokenizer_key,
        g.max_input_len,
        g.max_output_len,
        g.tokens_per_block,
        g.kv_blocks_total,
    )


class FitTable:
    """Engines with the same fit-relevant geometry answer together; a request's fit is a bit
    mask."""

    def __init__(self, engines: Sequence[EngineGeometry]):
        self.engines = list(engines)
        classes: dict[tuple, list] = {}
        for i, g in enumerate(self.engines):
            cls = classes.setdefault(_shape(g), [g, 0])
            cls[1] |= 1 << i
        self._classes = [(g, bits) for g, bits in classes.values()]

    def mask(self, req: BrokerRequest) -> int:
        m = 0
        n_new = req.max_new_tokens
        prompts = req.prompts
        for g, bits in self._classes:
            prompt = prompts.get(g.tokenizer_key)
            if prompt is None:
                continue
            n = len(prompt)
            if n <= g.max_input_len and n_new <= g.max_output_len and \
                    -(-(n + n_new) // g.tokens_per_block) <= g.kv_blocks_total:
                m |= bits
        return m

    def refusal(self, req: BrokerRequest, node: str) -> NoEngineFits:
        """What is wrong first (`prompt 444 tokens > max_input_len 384`), then where, the engines'
        limits, and the internal ids last (the request id, each tokenizer's key)."""
        problems = [(g, fit_problem(req, g)) for g in self.engines]
        distinct = list(dict.fromkeys(p for _, p in problems))
        if len(distinct) == 1:
            head = f"{distinct[0]}: it fits no engine on node {node}"
        else:
            head = f"it fits no engine on node {node}: " + "; ".join(
                f"{g.engine_id}: {p}" for g, p in problems
            )
        lengths = ", ".join(f"{k}: {len(v)}" for k, v in req.prompts.items()) or "none"
        return NoEngineFits(f"{head} (limits: {'; '.join(g.limits_text() for g in self.engines)}; "
                            "max_new_tokens "
                            f"{req.max_new_tokens}; request {req.request_id}, prompt tokens per "
                            f"tokenizer {lengths})")


class LengthBuckets:
    """Prompt-length buckets: by default powers of two from 16 up to the longest admissible
    prompt."""

    def __init__(self, max_len: int, boundaries: Optional[Sequence[int]] = None):
        if boundaries is None:
            b, bounds = MIN_BUCKET_TOKENS, []
            while True:
                bounds.append(b)
                if b >= max_len:
                    break
                b *= 2
        else:
            bounds = sorted(set(int(x) for x in boundaries))
            if not bounds or bounds[0] < 1:
                raise ValueError("length bucket boundaries must be positive ints, got "
                                 f"{list(boundaries)}")
            if bounds[-1] < max_len:
                bounds.append(max_len)
        self.bounds = bounds
        lower = [0] + bounds[:-1]
        self.lower = [lo + 1 for lo in lower]          # shortest prompt in each bucket
        self.labels = [f"<={b}" for b in bounds]

    def index(self, n_tokens: int) -> int:
        return min(bisect_left(self.bounds, n_tokens), len(self.bounds) - 1)

    def __len__(self) -> int:
        return len(self.bounds)


def grouping_view(engines: Sequence[EngineGeometry]) -> tuple[str, int]:
    """(tokenizer, block size) prefix groups are keyed in: the node's most common tokenizer, and the
    largest block size among its engines (block sizes are powers of two, so a prefix that fills one
    of those blocks fills whole blocks on every engine of that tokenizer)."""
    counts = Counter(g.tokenizer_key for g in engines)
    top = max(counts.values())
    key = next(g.tokenizer_key for g in engines if counts[g.tokenizer_key] == top)
    unit = max(g.tokens_per_block for g in engines if g.tokenizer_key == key)
    return key, unit
