"""Checkpoint folders for `forge contract new` tests, made in a test's tmp dir: a copy of the
embedded tiny-llama, a folder holding only a config.json (what a user has before downloading the
weights), and safetensors files with a header written byte by byte (the format: an 8-byte
little-endian length, a JSON header, the data)."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from tests.forge_cli import REPO

TINY = REPO / "forge" / "embedded" / "tiny-llama"
TINY_PARAMETERS = 2_885_888
# meta-llama/Llama-3.1-8B's config.json, the fields that size it (8,030,261,248 parameters).
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
}
LLAMA_8B_PARAMETERS = 8_030_261_248


def tiny_copy(tmp: Path, name: str = "tiny") -> Path:
    folder = tmp / name
    shutil.copytree(TINY, folder)
    return folder


def config_only(tmp: Path, config: dict, name: str = "model") -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def tiny_config(**changes) -> dict:
    return {**json.loads((TINY / "config.json").read_text()), **changes}


def write_config_text(folder: Path, text: str) -> None:
    (folder / "config.json").write_text(text)


def write_safetensors(path: Path, header, data_bytes: int = 0) -> Path:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)
    return path
