"""The bound of the hardware: how fast a tier could run a workload at best, printed beside the
measured time.

Two lower bounds on the window, each from one resource of the card (pure functions, tested by
hand-worked cases):

- **compute**: the FLOPs the work needs at the least, at the card's peak dense bf16 rate. Every
  forwarded token (a request's prompt, then each generated token but the last, fed back) runs the
  body's matmuls, 2 x body parameters; the output head runs only where a token is sampled; attention
  costs 4 x layers x query heads x head_dim x (keys it attends to) per token (QK^T and AV, causal).
  No credit for prefix reuse: this is the work of the workload, not of a particular cache.
- **memory**: the bytes that must cross HBM at the least, at the card's bandwidth: the weights once
  per engine step (all of them but the input embedding table, of which only rows are gathered), with
  the fewest steps the tier allows (every forwarded token fits some step's token budget; every
  sampled token some step's slots; a request's outputs come one step apart), plus every token's K
  and V written once and read back once by each later decode step of its request.

The workload is counted as planned (every request generates its max_new_tokens). Peaks come from a
per-card table of datasheet figures (CARD_PEAKS, with the source); measured ceilings can be passed
instead."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int4": 0.5}


@dataclass(frozen=True)
class CardPeak:
    dense_bf16_tflops: float
    hbm_tbps: float                      # TB/s, 10^12 bytes per second
    source: str


# NVML names -> datasheet peaks (dense, i.e. the sparsity figure halved).
CARD_PEAKS = {
    "NVIDIA H200": CardPeak(989.0, 4.8, "NVIDIA H200 datasheet "
                                        "(nvidia.com/en-us/data-center/h200): BF16 Tensor "
                            "Core 1,979 TFLOPS with sparsity = 989 dense; GPU memory bandwidth 4.8 "
                            "TB/s (SXM)"),
    "NVIDIA H100 80GB HBM3": CardPeak(989.0, 3.35, "NVIDIA H100 datasheet "
                                                   "(nvidia.com/en-us/data-center/h100): "
                                      "BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense; "
                                      "3.35 TB/s (SXM)"),
}


@dataclass(frozen=True)
class ModelShape:
    params: float  # every parameter (from the contract's weights_gib and precision)
    weight_bytes: int
    num_layers: int
    num_q_heads: int
    head_dim: int
    hidden: int
    vocab: int
    tied_head: bool                      # the output head shares the input embedding's weights
    kv_bytes_per_token: int
    bytes_per_weight: float


def compute_flops(shape: ModelShape, prompts: Sequence[int], outputs: Sequence[int]) -> dict:
    table = shape.vocab * shape.hidden
    body = shape.params - table - (0 if shape.tied_head else table)
    forwarded = sampled = attended = 0
    for n, m in zip(prompts, outputs):
        t = n + max(m, 1) - 1                    # tokens through the body
        forwarded += t
        sampled += m
        attended += t * (t + 1) // 2             # token at position p attends to p + 1 keys
    dense = 2 * body * forwarded + 2 * table * sampled
    attention = 4 * shape.num_layers * shape.num_q_heads * shape.head_dim * attended
    return {"forwarded_tokens": forwarded, "sampled_tokens": sampled, "dense_flops": dense,
            "attention_flops": attention, "flops": dense + attention}


def min_steps(prompts: Sequence[int], outputs: Sequence[int], budget: int, slots: int) -> int:
    forwarded = sum(n + max(m, 1) - 1 for n, m in zip(prompts, outputs))
    sampled = sum(outputs)
    return max(
        -(-forwarded // budget), -(-sampled // max(min(slots, budget), 1)), max(outputs, default=0)
    )


def memory_bytes(
    shape: ModelShape, prompts: Sequence[int], outputs: Sequence[int], steps: int
) -> dict:
    table_bytes = shape.vocab * shape.hidden * shape.bytes_per_weight
    per_step = shape.weight_bytes - (0 if shape.tied_head else table_bytes)
    written = read = 0
    for n, m in zip(prompts, outputs):
        written += n + max(m, 1) - 1
        # decode inputs at positions n .. n+m-2 read the keys before them
        read += sum(range(n, n + m - 1))
    kv = (written + read) * shape.kv_bytes_per_token
    return {"steps": steps, "weight_bytes_per_step": per_step, "weight_bytes": per_step * steps,
            "kv_bytes": kv, "bytes": per_step * steps + kv}


def bounds(
    shape: ModelShape,
    prompts: Sequence[int],
    outputs: Sequence[int],
    *,
    budget: int,
    slots: int,
    peak: CardPeak,
) -> dict:
    c = compute_flops(shape, prompts, outputs)
    m = memory_bytes(shape, prompts, outputs, min_steps(prompts, outputs, budget, slots))
    compute_s = c["flops"] / (peak.dense_bf16_tflops * 1e12)
    memory_s = m["bytes"] / (peak.hbm_tbps * 1e12)
    return {"compute": c, "memory": m, "compute_s": compute_s, "memory_s": memory_s,
            "bound_s": max(compute_s, memory_s), "peak": asdict(peak)}


def _config(contract) -> Optional[dict]:
    art = contract.artifact
    try:
        if art.checkpoint is not None:
            return json.loads(
                (contract.resolve(art.checkpoint) / "config.json").read_text(encoding="utf-8")
            )
        cfg = json.loads(
            (contract.resolve(art.engine_dir) / "config.json").read_text(encoding="utf-8")
        )
        return cfg.get("pretrained_config")
    except (OSError, ValueError):
        return None


def shape_of(plan) -> Optional[ModelShape]:
    """The model's shape from its contract and its checkpoint's config.json (None when
    unreadable)."""
    c = plan.contract
    cfg = _config(c)
    per = WEIGHT_BYTES.get(c.precision.weights)
    if cfg is None or per is None:
        return None
    cfg = cfg.get("text_config", cfg)
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if not heads or not hidden:
        return None
    return ModelShape(
        params=plan.weights_bytes / per,
        weight_bytes=plan.weights_bytes,
        num_layers=c.model.num_layers,
        num_q_heads=int(heads),
        head_dim=c.model.head_dim,
        hidden=int(hidden),
        vocab=c.model.vocab_size,
        tied_head=bool(cfg.get("tie_word_embeddings", False)),
        kv_bytes_per_token=plan.bytes_per_token,
        bytes_per_weight=per,
    )


def peak_of(card_model: str, peak_tflops: Optional[float] = None, hbm_tbps: Optional[float] = None
            ) -> Optional[CardPeak]:
    """The card's table entry, with any measured ceiling passed in replacing its datasheet
    figure."""
    base = CARD_PEAKS.get(card_model)
    if peak_tflops is None and hbm_tbps is None:
        return base
    if base is None and (peak_tflops is None or hbm_tbps is None):
        return None
    return CardPeak(
        peak_tflops if peak_tflops is not None else base.dense_bf16_tflops,
        hbm_tbps if hbm_tbps is not None else base.hbm_tbps,
        "measured ceilings passed on the command line"
        + (f"; datasheet: {base.source}" if base else ""),
    )


def tier_bounds(plan, requests, peaks: Optional[dict] = None) -> dict:
    """Bounds of this card plan on these bench requests, or {"unavailable": why}."""
    peaks = peaks or {}
    peak = peak_of(plan.card.model, peaks.get("peak_tflops"), peaks.get("hbm_tbps"))
    if peak is None:
        return {"unavailable": f"no peak figures for card model {plan.card.model!r} (pass "
                               "--peak-tflops and "
                               f"--hbm-tbps)"}
    shape = shape_of(plan)
    if shape is None:
        return {"unavailable": "the model's config.json (num_attention_heads, hidden_size) could "
                               "not be read"}
    lim = plan.contract.limits
    return bounds(shape, [len(r.prompt) for r in requests], [r.max_new_tokens for r in requests],
                  budget=lim.max_num_tokens, slots=lim.max_batch_size, peak=peak)


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def bounds_line(b: dict, window_s: Optional[float]) -> str:
    """One Markdown sentence: the measured window beside both bounds."""
    if "unavailable" in b:
        return f"Bounds of the hardware: {b['unavailable']}."
    measured = "" if not window_s else (f"measured {window_s:.2f} s = "
                                        f"{window_s / b['bound_s']:.1f} x the larger "
                                        "bound; ")
    return (f"Bounds of the hardware: {measured}compute bound {b['compute_s']:.2f} s "
            f"({_si(b['compute']['flops'], 'FLOP')} at {b['peak']['dense_bf16_tflops']:g} "
            "TFLOP/s), memory "
            f"bound {b['memory_s']:.2f} s ({_si(b['memory']['bytes'], 'B')}: weights x "
            f"{b['memory']['steps']:,} "
            f"steps + KV, at {b['peak']['hbm_tbps']:g} TB/s). Peaks: {b['peak']['source']}.")

