"""The hardware bounds, checked against sums worked out by hand on a toy shape, and on the H200
tiers."""
from __future__ import annotations

from pathlib import Path

import pytest

from forge.config.load import load_node
from forge_bench import bounds as bd
from forge_bench.workload import generate, load_workload

ROOT = Path(__file__).resolve().parents[2]

# 10 layers, 4 query heads of 8 (hidden 32), vocab 100, 1,000,000 parameters in bf16, untied head,
# 64 B of KV/token.
TOY = bd.ModelShape(
    params=1_000_000,
    weight_bytes=2_000_000,
    num_layers=10,
    num_q_heads=4,
    head_dim=8,
    hidden=32,
    vocab=100,
    tied_head=False,
    kv_bytes_per_token=64,
    bytes_per_weight=2,
)


def test_compute_flops_by_hand():
    # one request: 3 prompt tokens, 2 generated -> tokens through the body 3 + 2 - 1 = 4, sampled 2
    c = bd.compute_flops(TOY, [3], [2])
    body = 1_000_000 - 2 * 100 * 32  # minus the embedding and the untied head
    assert c["forwarded_tokens"] == 4 and c["sampled_tokens"] == 2
    assert c["dense_flops"] == 2 * body * 4 + 2 * 3200 * 2
    # positions 0..3 attend to 1..4 keys
    assert c["attention_flops"] == 4 * 10 * 4 * 8 * (1 + 2 + 3 + 4)
    tied = bd.ModelShape(**dict(TOY.__dict__, tied_head=True))
    assert (
        bd.compute_flops(tied, [3], [2])["dense_flops"] == 2 * (1_000_000 - 3200) * 4 + 2 * 3200 * 2
    )


def test_fewest_steps_the_tier_allows():
    assert bd.min_steps([3], [2], budget=8192, slots=128) == 2  # two outputs, one step apart
    # 1,000 tokens through 256-token steps
    assert bd.min_steps([100] * 10, [1] * 10, budget=256, slots=128) == 4
    # 192 sampled tokens, 16 per step
    assert bd.min_steps([1] * 64, [3] * 64, budget=8192, slots=16) == 12


def test_memory_bytes_by_hand():
    m = bd.memory_bytes(TOY, [3], [3], steps=3)
    assert m["weight_bytes_per_step"] == 2_000_000 - 3200 * 2  # the input table is only gathered
    # K/V written for 3 + 3 - 1 = 5 tokens; decode inputs at positions 3 and 4 read 3 and 4 keys
    assert m["kv_bytes"] == (5 + 3 + 4) * 64
    assert m["bytes"] == 3 * m["weight_bytes_per_step"] + m["kv_bytes"]


def test_bounds_against_a_peak_and_measured_ceilings():
    peak = bd.CardPeak(1.0, 0.001, "test")                                  # 1 TFLOP/s, 1 GB/s
    b = bd.bounds(TOY, [3], [2], budget=8, slots=4, peak=peak)
    assert b["compute_s"] == pytest.approx(b["compute"]["flops"] / 1e12)
    assert b["memory_s"] == pytest.approx(b["memory"]["bytes"] / 1e9)
    assert b["bound_s"] == max(b["compute_s"], b["memory_s"])
    assert bd.peak_of("NVIDIA H200").hbm_tbps == 4.8 and bd.peak_of("cpu") is None
    measured = bd.peak_of("NVIDIA H200", peak_tflops=700.0)
    assert (
        measured.dense_bf16_tflops == 700.0
        and measured.hbm_tbps == 4.8
        and "measured" in measured.source
    )
    assert bd.peak_of("cpu", 1.0, 0.05).hbm_tbps == 0.05 and bd.peak_of("cpu", 1.0) is None


def test_the_h200_tiers_on_gpu_mixed():
    """The issue's figure: gpu-mixed's 237,669 prompt tokens (512 records) through the 8B are ~3.8
    PFLOP."""
    spec = load_workload(ROOT / "docs" / "bench" / "workloads" / "gpu-mixed.yaml")
    for name, pflop in (("8b", 3.79), ("1p5b", 0.54)):
        plan = load_node(ROOT / "docs" / "bench" / "h200" / f"node-llama-{name}.yaml").plans[0]
        reqs = generate(spec, plan.contract.model.vocab_size, 512)
        assert sum(len(r.prompt) for r in reqs) == 237_669
        b = bd.tier_bounds(plan, reqs)
        assert b["compute"]["flops"] / 1e15 == pytest.approx(pflop, abs=0.01)
        assert b["compute_s"] > b["memory_s"] > 0  # compute bound on this workload
        assert b["memory"]["steps"] == 224  # 28,614 sampled tokens / 128 slots
        line = bd.bounds_line(b, 62.0)
        assert "compute bound" in line and "memory bound" in line and "nvidia.com" in line
    cpu = load_node(ROOT / "node_descriptions" / "local.yaml").plans[0]
    assert "no peak figures for card model 'cpu'" in bd.tier_bounds(cpu, reqs[:4])["unavailable"]
    assert "compute bound" in bd.bounds_line(
        bd.tier_bounds(cpu, reqs[:4], {"peak_tflops": 1, "hbm_tbps": 0.05}), None
    )
