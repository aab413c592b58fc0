"""Plain stats objects handed from the broker, runtime, ledger and runner to forge/metrics.py.

Nothing outside forge/metrics.py touches Prometheus: producers fill these and call the metrics
module's `observe_*` functions (or hand them to a report). Counters here are cumulative since
start."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """One card's admission runtime and engine, labelled node/card/tier."""

    node: str
    card: str                    # e.g. "gpu0", "cpu0"
    tier: str                    # contract name
    token_budget: int            # contract max_num_tokens
    slots: int                   # contract max_batch_size
    kv_blocks_total: int
    timestamp: float = field(default_factory=time.time)
    in_flight: int = 0
    kv_blocks_reserved: int = 0  # admission's reservation (input + requested output, block-rounded)
    kv_blocks_used: int = 0      # as the engine reports
    kv_blocks_free: int = 0
    engine_queued: int = 0
    tokens_last_step: int = 0
    input_tokens: int = 0        # cumulative
    output_tokens: int = 0       # cumulative
    requests_ok: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    requests_requeued: int = 0
    admission_refusals: int = 0  # engine said busy
    retries: int = 0
    stalls: int = 0
    progress_only_steps: int = 0
    healthy: bool = True
    # recent delivered (input+output) tokens/s, the broker's balancing signal
    tokens_per_s: float = 0.0
    # recent generated tokens/s (same EWMA weights): what `forge status` shows
    output_tokens_per_s: float = 0.0
    # cumulative engine steps (IterationStats.steps): mean tokens/step vs budget
    engine_steps: int = 0
    # cumulative prompt tokens the engine served from block reuse (IterationStats)
    prefix_hit_tokens: int = 0
    # cumulative sequences the engine preempted (IterationStats); admission keeps it 0
    preemptions: int = 0


@dataclass
class BrokerStats:
    node: str
    timestamp: float = field(default_factory=time.time)
    pending: int = 0                    # requests waiting in the broker
    pending_by_bucket: dict[str, int] = field(default_factory=dict)
    dispatched: int = 0                 # cumulative
    affinity_hits: int = 0              # dispatched to the engine their prefix group is pinned to
    affinity_spills: int = 0            # dispatched elsewhere because the pinned engine was full
    prompt_tokens: int = 0              # cumulative tokens of dispatched prompts
    # of those, tokens in a block-aligned prefix seen before on that engine
    shared_prefix_tokens: int = 0
    padded_tokens: int = 0  # (max len in batch x batch size) - real tokens, summed over batches
    batch_tokens: int = 0               # max len in batch x batch size, summed
    no_fit: int = 0                     # requests refused: no engine's geometry fits

    @property
    def padding_ratio(self) -> float:
        return self.padded_tokens / self.batch_tokens if self.batch_tokens else 0.0

    @property
    def prefix_reuse_ratio(self) -> float:
        return self.shared_prefix_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class LedgerStats:
    commits: int = 0
    rows_committed: int = 0
    last_commit_s: float = 0.0          # latency of the last commit
    total_commit_s: float = 0.0


@dataclass
class RunStats:
    """A forge run / deploy job, as the progress bar, summary and report see it."""

    total: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0                   # already in the output (resume)
    retried: int = 0
    in_flight: int = 0        # records started and not settled
    calls_in_flight: int = 0  # the functions' generate / embed calls waiting for their node
    records_limit: int = 0    # records the run lets be in flight now (functions/pace.py)
    input_tokens: int = 0     # prompt tokens
    output_tokens: int = 0    # generated tokens
    started_at: float = field(default_factory=time.time)
    producer_queue: int = 0            # records read and waiting for a function invocation slot
    writer_queue: int = 0              # results waiting to be written
