"""Node descriptions of CPU-bound `instant` cards (`instant: {step_cpu_ms: X}`, no model), written
as ordinary YAML files so every figure of `forge bench scaling` can be rerun by hand with `forge
bench run --node FILE`.

A card's speed is (tokens per step) ÷ (CPU per step); every card here has the same slots and token
budget, so speeds are set by `step_cpu_ms` alone: speeds 3:1 are cards of X and 3X ms per step. The
files are a pure function of the arguments (same arguments, same bytes)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import yaml

STEP_CPU_MS = 4.0                # CPU per engine step of the fastest card
SLOTS = 32                       # limits.max_batch_size
TOKEN_BUDGET = 256               # limits.max_num_tokens per step
MAX_INPUT_LEN = 256
MAX_OUTPUT_LEN = 64
TOKENS_PER_BLOCK = 32
CARD_MEMORY_GIB = 0.5


def speeds_of(text: str) -> list[float]:
    """"3:1" -> [3.0, 1.0] (relative speeds, the first card the fastest or not)."""
    try:
        out = [float(x) for x in text.split(":")]
    except ValueError:
        out = []
    if len(out) < 2 or any(x <= 0 for x in out):
        raise ValueError(f"speeds {text!r}: give two or more positive numbers like 3:1")
    return out


def step_ms_for(speeds: Sequence[float], step_cpu_ms: float = STEP_CPU_MS) -> list[float]:
    """The fastest card gets step_cpu_ms per step; a card k times slower gets k times as much."""
    top = max(speeds)
    return [round(step_cpu_ms * top / s, 6) for s in speeds]


def contract_doc(name: str, step_ms: float, tokenizer_dir: Path) -> dict:
    return {
        "contract": name,
        "backend": "instant",
        "model": {
            "architecture": "LlamaForCausalLM",
            "num_layers": 4,
            "num_kv_heads": 4,
            "head_dim": 32,
            "vocab_size": 2048,
            "weights_gib": 0.0,
        },
        "artifact": {"checkpoint": str(tokenizer_dir)},
        "precision": {"weights": "fp32", "kv_cache": "fp32"},
        "limits": {
            "max_batch_size": SLOTS,
            "max_num_tokens": TOKEN_BUDGET,
            "max_input_len": MAX_INPUT_LEN,
            "max_output_len": MAX_OUTPUT_LEN,
        },
        "kv_cache": {
            "tokens_per_block": TOKENS_PER_BLOCK,
            "max_tokens": SLOTS * (MAX_INPUT_LEN + MAX_OUTPUT_LEN),
            "host_cache_size": 0,
            "block_reuse": True,
        },
        "target": {"kind": "cpu"},
        "instant": {"step_cpu_ms": step_ms},
    }


def write_cpu_node(folder: Path, name: str, step_ms: Sequence[float]) -> Path:
    """`folder/name.yaml`: one card per entry of step_ms, and one contract file per distinct
    value."""
    from forge.embedded import TINY_MODEL_DIR  # its tokenizer.json decodes the synthetic outputs

    if not step_ms:
        raise ValueError("a node needs at least one card")
    folder.mkdir(parents=True, exist_ok=True)
    contracts: dict[float, str] = {}
    for ms in step_ms:
        if ms not in contracts:
            cname = f"cpu-steps-{ms:g}ms".replace(".", "p")
            contracts[ms] = cname
            _write(
                folder / f"{cname}.yaml",
                f"# CPU-bound instant engine (no model): {ms:g} ms of "
                "Python CPU per "
                f"step, {SLOTS} slots, {TOKEN_BUDGET} tokens per step.",
                contract_doc(cname, ms, TINY_MODEL_DIR),
            )
    node = {
        "node": name,
        "contracts": [f"{c}.yaml" for c in contracts.values()],
        "host": {
            "memory_gib": max(1, round(CARD_MEMORY_GIB * len(step_ms))),
            "cpu_cores": len(step_ms),
        },
        "cards": [
            {
                "index": i,
                "kind": "cpu",
                "model": "cpu",
                "memory_gib": CARD_MEMORY_GIB,
                "engine": contracts[ms],
            }
            for i, ms in enumerate(step_ms)
        ],
        "metrics": {"port": 0},
    }
    path = folder / f"{name}.yaml"
    _write(path, f"# {len(step_ms)} CPU-bound instant card(s), written by "
                 "bench/forge_bench/cpu_nodes.py.", node)
    return path


def _write(path: Path, comment: str, doc: dict) -> None:
    path.write_text(
        comment + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None),
        encoding="utf-8",
    )
