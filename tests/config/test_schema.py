"""JSON Schemas: generated from the models, committed under docs/schemas/, and usable by editors."""
from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from forge.config import schema as schemas
from forge.config.registry import Registry
from tests.config.conftest import REPO

DOCS = REPO / "docs" / "schemas"


@pytest.mark.parametrize("kind", schemas.KINDS)
def test_committed_schema_matches_the_models(kind):
    committed = (DOCS / schemas.file_name(kind)).read_text(encoding="utf-8")
    assert committed == schemas.dump(schemas.json_schemas()[kind]), (
        f"docs/schemas/{schemas.file_name(kind)} drifted from the models: run `forge schema --out "
        "docs/schemas`")


def test_examples_validate_against_the_committed_schemas():
    for folder, kind in (("node_descriptions", "node"), ("engine_contracts", "contract")):
        validator = jsonschema.Draft202012Validator(
            json.loads((DOCS / schemas.file_name(kind)).read_text())
        )
        for path in sorted((REPO / folder).glob("*.yaml")):
            errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
            assert errors == [], f"{path.name}: {[e.message for e in errors]}"


def test_schemas_are_strict_and_leave_no_default_for_limits_or_kv_cache():
    c = schemas.json_schemas(Registry())["contract"]
    assert c["additionalProperties"] is False and "sections" not in c["properties"]
    assert set(c["$defs"]["Limits"]["required"]) == {
        "max_batch_size",
        "max_num_tokens",
        "max_input_len",
        "max_output_len",
    }
    assert {"tokens_per_block", "host_cache_size", "block_reuse"} <= set(
        c["$defs"]["KvCache"]["required"]
    )
    for name in ("Limits", "KvCache"):
        for field, spec in c["$defs"][name]["properties"].items():
            assert spec.get("default") is None, f"{name}.{field} has a default"


def test_plugin_sections_join_the_contract_schema():
    from pydantic import BaseModel, ConfigDict

    class Extra(BaseModel):
        model_config = ConfigDict(extra="forbid")
        knob: int

    c = schemas.json_schemas(Registry(sections={"myengine": Extra}))["contract"]
    assert c["properties"]["myengine"]["required"] == ["knob"]
    assert "myengine" not in schemas.json_schemas(Registry())["contract"]["properties"]
