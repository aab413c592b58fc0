"""A tier as files: a contract (and the one-card node that runs it) written as YAML that `forge
validate` loads.

The sweep writes every candidate this way and loads it back through the one load pipeline, so a
candidate that breaks a contract rule is refused by the same checks a user's file meets, and the
winner it writes with --write-best is exactly a file that was validated. Paths inside a contract are
relative to its file, so they are rebased onto the folder the copy is written to: the artifact's,
and a backend section's fields marked `json_schema_extra={"forge_path": True}`
(transformers.graph_shape_cache)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Sequence

import yaml
from pydantic import BaseModel

from forge.config.load import LoadedDescription, load_node
from forge.config.models import Card, Contract

ARTIFACT_PATHS = ("engine_dir", "checkpoint", "tokenizer")


def contract_data(contract: Contract, dest_dir: Path) -> dict:
    """The contract as the mapping a file holds: forge's keys, then each backend section (its non-default values)."""
    data = contract.model_dump(mode="json", exclude={"sections"}, exclude_none=True)
    for key in ARTIFACT_PATHS:
        rel = data["artifact"].get(key)
        if rel is not None:
            data["artifact"][key] = os.path.relpath(contract.resolve(rel), dest_dir.resolve())
    if not data["artifact"].get("random_weights"):
        data["artifact"].pop("random_weights", None)
    for key, section in contract.sections.items():
        data[key] = (
            section.model_dump(mode="json", exclude_defaults=True)
            if isinstance(section, BaseModel)
            else section
        )
        # a backend's path fields (json_schema_extra forge_path) too
        if isinstance(section, BaseModel):
            for name, info in type(section).model_fields.items():
                if (info.json_schema_extra or {}).get("forge_path") and data[key].get(
                    name
                ) is not None:
                    data[key][name] = os.path.relpath(
                        contract.resolve(data[key][name]), dest_dir.resolve()
                    )
    return data


def node_data(
    loaded: LoadedDescription, card: Card, contract_file: str, name: Optional[str] = None
) -> dict:
    """The node with only this card, whose contracts list is the one contract file."""
    data = loaded.node.model_dump(mode="json", exclude_none=True)
    if name:
        data["node"] = name
    data["contracts"] = [contract_file]
    data["cards"] = [card.model_dump(mode="json", exclude_none=True)]
    if card.replicas == 1:
        data["cards"][0].pop("replicas", None)
    return data


def _text(data: dict, comments: Sequence[str]) -> str:
    head = "".join(f"# {line}\n" for line in comments)
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def write_contract(contract: Contract, path: Path, comments: Sequence[str] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_text(contract_data(contract, path.parent), comments), encoding="utf-8")
    return path


def write_tier(loaded: LoadedDescription, contract: Contract, card: Card, folder: Path,
               comments: Sequence[str] = ()) -> tuple[Path, Path]:
    """contract.yaml + node.yaml in `folder` (the node names the contract by its relative path)."""
    folder.mkdir(parents=True, exist_ok=True)
    cpath = write_contract(contract, folder / "contract.yaml", comments)
    npath = folder / "node.yaml"
    npath.write_text(
        _text(
            node_data(loaded, card.model_copy(update={"engine": contract.contract}), cpath.name),
            comments,
        ),
        encoding="utf-8",
    )
    return cpath, npath


def write_node(loaded: LoadedDescription, card: Card, contract_path: Path, path: Path,
               comments: Sequence[str] = ()) -> Path:
    """A one-card node named after its file (so it can sit beside the node it came from), running the contract."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(contract_path.resolve(), path.parent.resolve())
    name = (
        path.stem
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", path.stem)
        else f"{loaded.node.node}-best"
    )
    path.write_text(_text(node_data(loaded, card, rel, name), comments), encoding="utf-8")
    return path


def load_tier(node_path: Path) -> tuple[Optional[LoadedDescription], Optional[str]]:
    """(the loaded node, None), or (None, every error on one line) when a rule refuses it."""
    from forge.errors import ConfigError

    try:
        return load_node(node_path), None
    except ConfigError as exc:
        errors = [p for p in exc.problems if p.severity == "error"] or exc.problems
        return None, "; ".join(f"{p.path}: {p.message}" for p in errors)
