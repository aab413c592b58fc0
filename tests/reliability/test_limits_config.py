"""`limits:` values no engine represents are refused when the description loads, not when the engine
does (issue 29): `max_batch_size: 1e32` (written as a YAML float or as digits) validated and failed
only at engine load. Through `forge validate` in-process (click's runner): one
`file::$.limits.<key>` line each."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from tests.reliability._rel import FIXTURES


@pytest.mark.parametrize(
    "key", ["max_batch_size", "max_num_tokens", "max_input_len", "max_output_len"]
)
@pytest.mark.parametrize("value", ["1.0e+32", "100000000000000000000000000000000", "2147483648"])
def test_a_limit_past_int32_is_refused_at_validation(tmp_path, monkeypatch, key, value):
    from forge.cli import _register_all, cli

    shutil.copytree(FIXTURES / "contracts", tmp_path / "contracts")
    (tmp_path / "nodes").mkdir()
    shutil.copy(FIXTURES / "nodes" / "instant.yaml", tmp_path / "nodes" / "instant.yaml")
    contract = tmp_path / "contracts" / "instant-tiny.yaml"
    text = contract.read_text().replace("../../../../forge", str(FIXTURES.parents[2] / "forge"))
    line = next(x for x in text.splitlines() if x.strip().startswith(f"{key}:"))
    contract.write_text(text.replace(line, f"  {key}: {value}"))
    monkeypatch.chdir(tmp_path)
    if "validate" not in cli.commands:
        _register_all()
    r = CliRunner().invoke(cli, ["validate", "nodes/instant.yaml"], standalone_mode=False)
    assert r.exception is None and r.return_value == 1, r.output
    problems = [x for x in r.output.splitlines() if "::$" in x and "warning" not in x]
    assert any(p.startswith(f"contracts/instant-tiny.yaml::$.limits.{key}:") for p in problems), (
        r.output
    )
