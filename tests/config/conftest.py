"""Shared builders for config tests: contracts and nodes as plain dicts, changed per test."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

TRT_CONTRACT = {
    "contract": "t1k",
    "backend": "trtllm",
    "model": {
        "architecture": "LlamaForCausalLM",
        "num_layers": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 32000,
        "weights_gib": 7.2,
    },
    "artifact": {
        "engine_dir": str(REPO / "engines/llama7b-fp8-1k"),
        "tokenizer": str(REPO / "engines/llama7b-tokenizer"),
    },
    "precision": {"weights": "fp8", "kv_cache": "fp8"},
    "limits": {
        "max_batch_size": 256,
        "max_num_tokens": 8192,
        "max_input_len": 1024,
        "max_output_len": 128,
    },
    "kv_cache": {
        "tokens_per_block": 32,
        "free_gpu_memory_fraction": 0.85,
        "host_cache_size": 0,
        "block_reuse": True,
    },
    "target": {"kind": "gpu", "compute_capability": "12.0"},
}
NODE = {
    "node": "n", "contracts": ".", "host": {"memory_gib": 128, "cpu_cores": 24},
    "cards": [{"index": 0, "kind": "gpu", "model": "NVIDIA GeForce RTX 5090", "memory_gib": 32,
               "compute_capability": "12.0", "engine": "t1k"}],
    "metrics": {"port": 9400},
}


def trt_contract(**changes) -> dict:
    """The standard FP8 tier as a dict; changes are {"section.key": value} (None deletes the
    key)."""
    return _changed(TRT_CONTRACT, changes)


def node(**changes) -> dict:
    return _changed(NODE, changes)


def _changed(base: dict, changes: dict) -> dict:
    data = copy.deepcopy(base)
    for dotted, value in changes.items():
        cur = data
        *parents, last = dotted.split(".")
        for p in parents:
            cur = cur[p]
        if value is None:
            cur.pop(last, None)
        else:
            cur[last] = value
    return data


@pytest.fixture
def write(tmp_path):
    """write(name, data) puts a YAML file (or raw text/bytes) under tmp_path and returns its
    path."""
    def _write(name: str, data) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        elif isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path
    return _write
