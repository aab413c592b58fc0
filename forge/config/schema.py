"""JSON Schemas of both formats, generated from the pydantic models (the single source of truth),
plus the contract sections that plugins register. Exported by `forge schema`, committed under
docs/schemas/, and used by the loader to find every error with its JSON path."""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Optional

import jsonschema
from pydantic import BaseModel

from forge.config.models import Contract, NodeDescription
from forge.config.registry import Registry

DIALECT = "https://json-schema.org/draft/2020-12/schema"
KINDS = ("node", "contract")


def _base(model: type[BaseModel], title: str, description: str) -> dict:
    schema = model.model_json_schema(mode="validation")
    schema["title"] = title
    schema["description"] = description
    return {"$schema": DIALECT, **schema}


def _add_section(schema: dict, key: str, model: type[BaseModel]) -> None:
    prefix = f"{key}__"
    sub = model.model_json_schema(mode="validation", ref_template="#/$defs/" + prefix + "{model}")
    defs = sub.pop("$defs", {})
    schema.setdefault("$defs", {}).update({prefix + name: d for name, d in defs.items()})
    schema["properties"][key] = sub


@lru_cache(maxsize=8)
def _contract_schema(section_items: tuple) -> dict:
    schema = _base(Contract, "forge engine contract",
                   "One engine tier: its model, artifact, precision, token limits and KV-cache "
                   "sizing. "
                   "No limit and no cache size has a default.")
    # `sections` is where plugin sections are stored after loading; users write the section keys.
    schema["properties"].pop("sections", None)
    for key, model in section_items:
        _add_section(schema, key, model)
    return schema


@lru_cache(maxsize=1)
def _node_schema() -> dict:
    return _base(NodeDescription, "forge node description",
                 "A node: its host, its cards, and the engine contract each card runs.")


def _sections(registry: Optional[Registry]) -> tuple:
    if registry is None:
        from forge.config.registry import from_plugins

        registry = from_plugins()
    return tuple(sorted(registry.sections.items()))


def json_schemas(registry: Optional[Registry] = None) -> dict[str, dict]:
    """{"node": schema, "contract": schema}; plugin sections come from `registry` (default: plugins)."""
    return {
        "node": copy.deepcopy(_node_schema()),
        "contract": copy.deepcopy(_contract_schema(_sections(registry))),
    }


@lru_cache(maxsize=8)
def _validator(kind: str, section_items: tuple) -> jsonschema.Draft202012Validator:
    schema = _node_schema() if kind == "node" else _contract_schema(section_items)
    return jsonschema.Draft202012Validator(schema)


def validator_for(kind: str, registry: Registry) -> jsonschema.Draft202012Validator:
    return _validator(kind, tuple(sorted(registry.sections.items())))


def dump(schema: dict) -> str:
    """The committed text form: stable key order, two-space indent, final newline."""
    return json.dumps(schema, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def file_name(kind: str) -> str:
    return f"{kind}.schema.json"
