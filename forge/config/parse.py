"""One file, start to finish: bounded bytes -> UTF-8 -> safe YAML -> one mapping with top key `node`
or `contract` -> normalized -> every schema error with its JSON path -> the pydantic model."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import pydantic

from forge.config import schema as schemas
from forge.config.files import FileRefused, decode_text, read_bytes, shown
from forge.config.messages import (
    describe,
    did_you_mean,
    json_path,
    pydantic_findings,
    schema_findings,
)
from forge.config.models import Contract, NodeDescription
from forge.config.placeholders import find_placeholders, placeholder_message
from forge.config.registry import Registry
from forge.config.yamlsafe import YamlRefused, load_yaml
from forge.errors import Problem

KINDS = ("node", "contract")
WHAT = "a node description (top key 'node') or an engine contract (top key 'contract')"


@dataclass
class ParsedFile:
    path: Path                       # absolute, as given (relative paths inside resolve against it)
    display: str                     # as the user reads it
    kind: Optional[str] = None       # "node" | "contract" once the top key is known
    # the top key's value when it is a string, even if the file is invalid
    name: Optional[str] = None
    model: Union[NodeDescription, Contract, None] = None
    problems: list[Problem] = field(default_factory=list)
    # A node's `contracts:` as written, when it is a path or a list of paths: its contracts are read
    # and checked even when the node itself has errors (their problems are independent of the
    # node's).
    contracts_named: Union[str, list, None] = None

    def add(self, path: str, message: str, severity: str = "error") -> None:
        self.problems.append(Problem(self.display, path, message, severity))


def _normalize_cc(value):
    """YAML reads 12.0 as a number; a compute capability is a "major.minor" string."""
    if isinstance(value, float) and math.isfinite(value) and round(value, 1) == value:
        return f"{value:.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value}.0"
    return value


def _normalize(kind: str, data: dict, pf: ParsedFile) -> None:
    """Refuse what JSON Schema cannot see (non-string keys, NaN, binary), fix YAML number quirks."""
    def walk(value, parts: tuple) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    pf.add(json_path(parts), f"key {k!r} must be a string")
                    continue
                walk(v, parts + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, parts + (i,))
        elif isinstance(value, float) and not math.isfinite(value):
            pf.add(json_path(parts), f"{value} is not a finite number")
        elif not isinstance(value, (str, int, float, bool, type(None))):
            pf.add(json_path(parts), f"unsupported YAML value of type {type(value).__name__}")

    walk(data, ())
    if (
        kind == "contract"
        and isinstance(data.get("target"), dict)
        and "compute_capability" in data["target"]
    ):
        data["target"]["compute_capability"] = _normalize_cc(data["target"]["compute_capability"])
    if kind == "node" and isinstance(data.get("cards"), list):
        for card in data["cards"]:
            if isinstance(card, dict) and "compute_capability" in card:
                card["compute_capability"] = _normalize_cc(card["compute_capability"])


def _shape(data) -> str:
    """What a whole document is, without quoting it: a description may name any readable file (an .env, a
    key), and its content must not end up in a log."""
    if isinstance(data, str):
        return f"string of {len(data)} characters"
    if isinstance(data, bool):
        return "a boolean"
    if isinstance(data, (int, float)):
        return "a number"
    return describe(data)


def _top(data, pf: ParsedFile) -> Optional[str]:
    if data is None:
        pf.add("$", f"empty file: expected {WHAT}")
        return None
    if not isinstance(data, dict):
        pf.add("$", f"expected a mapping, got {_shape(data)}: a file is {WHAT}")
        return None
    kinds = [k for k in KINDS if k in data]
    if len(kinds) == 2:
        pf.add("$", f"both top keys 'node' and 'contract': a file is {WHAT}, not both")
        return None
    if not kinds:
        keys = [k for k in data if isinstance(k, str)]
        hint = next(
            (did_you_mean(k, KINDS) for k in keys if "did you mean" in did_you_mean(k, KINDS)), ""
        )
        pf.add("$", f"neither top key 'node' nor 'contract'{hint}: a file is {WHAT}")
        return None
    return kinds[0]


def _build(kind: str, data: dict, reg: Registry, schema_found: bool):
    """The pydantic model, or None; adds rule errors (power of two, exactly-one-of) at their paths."""
    findings: list[tuple[str, str]] = []
    payload = dict(data)
    model_cls = NodeDescription if kind == "node" else Contract
    if kind == "contract":
        sections = {}
        for key, sec_model in reg.sections.items():
            if key in payload:
                raw = payload.pop(key)
                try:
                    sections[key] = sec_model.model_validate(raw)
                except pydantic.ValidationError as e:
                    findings += pydantic_findings(e, (key,), only_value_errors=schema_found)
        payload["sections"] = sections
        backend = data.get("backend")
        if isinstance(backend, str) and backend not in reg.backends:
            known = sorted(reg.backends)
            findings.append(("$.backend", "unknown backend "
                                          f"{backend!r}{did_you_mean(backend, known)}" if known
                             else f"unknown backend {backend!r} (no engine backend plugin is "
                                  "installed)"))
    model = None
    try:
        model = model_cls.model_validate(payload)
    except pydantic.ValidationError as e:
        findings += pydantic_findings(e, (), only_value_errors=schema_found)
    return model, findings


def parse_file(path: Path, reg: Registry) -> ParsedFile:
    """Parse and schema-check one file; every problem lands in .problems, the model only if none."""
    pf = ParsedFile(path=Path(path).absolute(), display=shown(path))
    try:
        data = load_yaml(decode_text(read_bytes(pf.path)))
    except (FileRefused, YamlRefused) as e:
        pf.add("$", str(e))
        return pf
    kind = _top(data, pf)
    if kind is None:
        return pf
    pf.kind = kind
    pf.name = data[kind] if isinstance(data[kind], str) else None
    named = data.get("contracts") if kind == "node" else None
    if (isinstance(named, str) and named) or (isinstance(named, list) and named
                                              and all(isinstance(x, str) and x for x in named)):
        pf.contracts_named = named
    _normalize(kind, data, pf)
    if pf.problems:
        return pf
    holes = find_placeholders(data)
    for path_, asks in holes:
        pf.add(path_, placeholder_message(asks))
    hole_paths = {path_ for path_, _ in holes}  # a placeholder's type error is said by its own line
    schema_found = schema_findings(schemas.validator_for(kind, reg), data)
    model, rule_findings = _build(kind, data, reg, schema_found=bool(schema_found))
    found = [item for item in schema_found if item[0] not in hole_paths]
    seen = set(found)
    for item in rule_findings:
        if item not in seen and item[0] not in hole_paths:
            seen.add(item)
            found.append(item)
    for path_, message in found:
        pf.add(path_, message)
    if not pf.problems and model is not None:
        model._source = pf.path
        pf.model = model
    return pf
