"""The embedded default: one CPU card running the tiny Llama-shaped model shipped in this folder."""
from __future__ import annotations

from pathlib import Path

from forge.errors import ForgeError

TINY_MODEL_DIR = Path(__file__).resolve().parent / "tiny-llama"
_REPO = Path(__file__).resolve().parents[2]


def default_node_path() -> Path:
    """node_descriptions/local.yaml of this checkout (forge is installed editable, as the README says)."""
    path = _REPO / "node_descriptions" / "local.yaml"
    if not path.is_file():
        raise ForgeError(f"the embedded default node ({path}) is not here: install forge from its checkout "
                         "with `pip install -e .`, or pass --node NODE.yaml")
    return path
