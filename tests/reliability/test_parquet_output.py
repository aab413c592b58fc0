"""A Parquet output is read back before a run says it is complete (issue 29, rows 3, 4 and 8). What
its typed columns cannot hold (nesting too deep for Parquet readers, integers outside int64, keys
that differ per record) goes to the JSON column, and the conversion stays linear in rows. Real
`forge run` subprocesses on the instant node; the linearity case converts a real staging file
in-process (it is the conversion alone)."""
from __future__ import annotations

import json
import time

import pytest

from tests.reliability._rel import assert_no_traceback, forge, record_figures, run_argv

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

N = 12
POISON = '''
import forge

def nest(depth, make):
    value = 0
    for _ in range(depth):
        value = make(value)
    return value

@forge.function(max_output_tokens=8)
async def poison(record: dict, llm: forge.LLM):
    i = record["id"]
    kind = {3: "lists", 5: "objects", 7: "big", 9: "small"}.get(i, "plain")
    if kind == "lists":
        return nest(50, lambda v: [v])
    if kind == "objects":
        return nest(99, lambda v: {"a": v})
    if kind == "big":
        return {"id": i, "n": 2**64}
    if kind == "small":
        return {"id": i, "n": -2**63 - 1}
    return {"id": i, "n": i}
'''


def _expected(i: int):
    def nest(depth, make):
        value = 0
        for _ in range(depth):
            value = make(value)
        return value
    return {3: nest(50, lambda v: [v]), 5: nest(99, lambda v: {"a": v}), 7: {"id": 7, "n": 2**64},
            9: {"id": 9, "n": -2**63 - 1}}.get(i, {"id": i, "n": i})


def _run(fn, inp, out, *extra):
    return forge(*run_argv(fn, inp, out)[3:], *extra, timeout=180)


def _results(path) -> dict[int, object]:
    table = pq.read_table(path)
    col = "result_json" if "result_json" in table.column_names else "result"
    rows = table.to_pylist()
    return {r["index"]: (json.loads(r[col]) if col == "result_json" else r[col]) for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("only", [None, 3, 5, 7, 9])
def test_results_the_typed_columns_cannot_hold_go_to_the_json_column(tmp_path, only):
    """50 nested lists, 99 nested objects, 2**64, -2**63-1: the run exits 0, the file opens, every
    value reads back exactly, no temp file is left, and the rerun says complete (it said 'not forge
    output' or crashed)."""
    fn = tmp_path / "poison.py"
    fn.write_text(POISON)
    ids = range(N) if only is None else [0, 1, only]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": "x"}) + "\n" for i in ids))
    out = tmp_path / "out.parquet"
    r = _run(fn, inp, out)
    assert_no_traceback(r.stderr)
    assert r.returncode == 0, r.stderr
    got = _results(out)
    assert got == {k: _expected(i) for k, i in enumerate(ids)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "in.jsonl",
        "out.parquet",
        "out.parquet.ledger.sqlite",
        "poison.py",
    ]
    r = _run(fn, inp, out)
    assert r.returncode == 0 and "already complete" in r.stderr, r.stderr
    r = _run(fn, inp, out, "--restart")
    assert r.returncode == 0, r.stderr
    assert _results(out) == got


@pytest.mark.slow
def test_a_typed_output_stays_typed(tmp_path):
    """What fits keeps its typed column (the JSON column is the fallback, not the rule)."""
    fn = tmp_path / "poison.py"
    fn.write_text(POISON)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": "x"}) + "\n" for i in (0, 1, 2, 4)))
    out = tmp_path / "out.parquet"
    assert _run(fn, inp, out).returncode == 0
    assert "result" in pq.read_schema(out).names


@pytest.mark.parametrize("rows", [10_000])
def test_keys_that_differ_per_record_convert_in_linear_time(tmp_path, rows):
    """Row 8: 10,000 results, each with its own key. Arrow unified them into one struct of 10,000
    fields, so each batch cost grew with the rows seen (27 s here; 40,000 rows took 656 s). They go
    to the JSON column now."""
    from forge.records.parquet_out import jsonl_to_parquet

    staging = tmp_path / "out.parquet.staging.jsonl"
    with open(staging, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"index": i, "result": {f"key{i}": i}}) + "\n")
    t0 = time.monotonic()
    assert jsonl_to_parquet(staging, tmp_path / "out.parquet") == rows
    seconds = time.monotonic() - t0
    schema = pq.read_schema(tmp_path / "out.parquet")
    assert schema.names == ["index", "result_json", "error_type", "error_message"], schema
    got = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [json.loads(r["result_json"]) for r in got[:3]] == [
        {"key0": 0},
        {"key1": 1},
        {"key2": 2},
    ]
    record_figures("parquet-varying-keys", rows=rows, seconds=round(seconds, 2))


def test_an_output_that_cannot_be_read_back_keeps_its_staging_file(tmp_path, monkeypatch):
    """When even the JSON column cannot be read back, the run is not complete: the staging file
    stays (the rows are not lost) and the error is one line naming the output."""
    from forge.errors import ForgeError
    from forge.records import parquet_out

    staging = tmp_path / "out.parquet.staging.jsonl"
    staging.write_text(json.dumps({"index": 0, "result": 1}) + "\n")
    monkeypatch.setattr(parquet_out, "_read_back", lambda path, rows: "injected: cannot read it "
                                                                      "back")
    with pytest.raises(ForgeError, match="cannot write Parquet.*injected"):
        parquet_out.jsonl_to_parquet(staging, tmp_path / "out.parquet")
    assert staging.exists() and not (tmp_path / "out.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet.staging.jsonl"]
