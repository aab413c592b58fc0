"""`forge bench` writes fixed names into --out; it never writes over such a file that it did not
write (issue 13, item 1: every file forge writes is checked for what it would overwrite)."""
from __future__ import annotations

import json

import pytest

from tests.forge_cli import forge, invoke


@pytest.mark.parametrize("name, content", [("control-plane.md", "# my notes\n"),
                                           ("control-plane.json", '{"mine": true}\n'),
                                           ("work", None)])
def test_a_folder_holding_files_bench_did_not_write_is_refused(tmp_path, name, content):
    target = tmp_path / name
    if content is None:
        target.mkdir()
        (target / "records.jsonl").write_text('{"my": "data"}\n')
        keep = target / "records.jsonl"
    else:
        target.write_text(content)
        keep = target
    before = keep.read_bytes()
    proc = invoke("bench", "control-plane", "--records", 200, "--repeat", 1, "--out", tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"forge: {target}: exists and was not written by forge bench; forge never writes over a "
        "file it did "
        "not write: choose another --out"]
    assert keep.read_bytes() == before


@pytest.mark.slow
def test_a_folder_bench_wrote_is_written_again(tmp_path):
    for _ in range(2):
        proc = forge(
            "bench", "control-plane", "--records", 200, "--repeat", 1, "--out", tmp_path, timeout=60
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        json.loads((tmp_path / "control-plane.json").read_text())["kind"]
        == "forge-bench-control-plane"
    )
