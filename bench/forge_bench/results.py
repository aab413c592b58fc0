"""What one measured mode produced: the window, the tokens, and the ratios the report quotes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class ModeResult:
    mode: str                         # "direct", "forge", "fifo" (or a sweep tier's label)
    variant: str                      # which of a mode's ways ran, e.g. "depth=64" for direct
    requests: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0   # prompt tokens of completed requests
    output_tokens: int = 0  # generated tokens (a final EOS not counted, as forge reports it)
    window_s: float = 0.0   # first request handed in -> last result out
    # wall clock (time.time()) at the window's start: lines a run up with other records of the same
    # time (an engine's step log)
    started_at: Optional[float] = None
    cpu_s: Optional[float] = None     # CPU time of this process (all threads) over the window
    prefix_hit_tokens: Optional[int] = None  # prompt tokens the engine served from reused KV blocks
    padding_ratio: Optional[float] = None    # broker-formed batches only
    broker_prefix_reuse_ratio: Optional[float] = None
    # broker: dispatched to the card their prefix group is pinned to
    affinity_hits: Optional[int] = None
    # broker: dispatched elsewhere because that card was past its bound
    affinity_spills: Optional[int] = None
    scope: Optional[str] = None  # several-card nodes: the card that ran alone, or "together"
    repeat: Optional[int] = None                 # which interleaved repeat (1-based)
    # card -> its tokens and prefix hits in this run
    per_card: dict[str, dict] = field(default_factory=dict)
    # engine steps (forward passes) over the window, every card summed
    engine_steps: Optional[int] = None
    # card -> GPU utilisation over the window (bench/forge_bench/gpu_sampler.py)
    gpu_util: Optional[dict[str, dict]] = None
    # why gpu_util is None ("no NVML: ...", "no GPU card in this node")
    gpu_util_missing: Optional[str] = None
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return (
            (self.input_tokens + self.output_tokens) / self.window_s if self.window_s > 0 else 0.0
        )

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.window_s if self.window_s > 0 else 0.0

    @property
    def prefix_reuse_ratio(self) -> Optional[float]:
        """Measured in the engine: reused prompt tokens / prompt tokens."""
        if self.prefix_hit_tokens is None or not self.input_tokens:
            return None
        return self.prefix_hit_tokens / self.input_tokens

    @property
    def ms_per_step(self) -> Optional[float]:
        """Mean wall time of one engine step over the window (one card; summed steps on several)."""
        return 1000 * self.window_s / self.engine_steps if self.engine_steps else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            tokens_per_s=round(self.tokens_per_s, 2),
            output_tokens_per_s=round(self.output_tokens_per_s, 2),
            requests_per_s=round(self.requests_per_s, 3),
            prefix_reuse_ratio=self.prefix_reuse_ratio,
            ms_per_step=round(self.ms_per_step, 3) if self.ms_per_step is not None else None,
        )
        d["window_s"] = round(self.window_s, 4)
        if self.cpu_s is not None:
            d["cpu_s"] = round(self.cpu_s, 4)
            d["requests_per_cpu_s"] = (
                round(self.completed / self.cpu_s, 3) if self.cpu_s > 0 else None
            )
        return d


def best(results: list[ModeResult]) -> Optional[ModeResult]:
    """The fastest complete run (total tokens/s); None if none completed everything."""
    done = [r for r in results if r.completed == r.requests and r.requests]
    return max(done, key=lambda r: r.tokens_per_s, default=None)
