"""--retry-errors at the ledger's edge (forge/ledger/retry.py), on real files and a real SQLite
ledger: the error rows leave the output before they are made again, the good rows stay byte for
byte, and a kill between the steps leaves files the ordinary resume explains (each index exactly
once). The whole command on the real engine: tests/e2e/test_retry_errors.py."""
from __future__ import annotations

import asyncio
import json

import pytest

from forge.errors import ForgeError
from forge.ledger import Ledger, default_ledger_path, make_run_key, open_run, staging_path
from forge.ledger.retry import open_retry
from forge.records import open_records

N = 12
BAD = {0, 5, 11}


@pytest.fixture
def job(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(N)))
    fn = tmp_path / "fn.py"
    fn.write_text("def f(r): return r\n")
    return tmp_path, inp, fn


def _key(inp, fn, name="f"):
    return make_run_key(function_file=fn, function_name=name, source=open_records(inp))


def _hand(run, items) -> None:
    async def go():
        for i, ok in items:
            await run.aput_attempt(i)
            if ok:
                await run.aput_result(i, {"v": i, "k": "x"})
            else:
                await run.aput_error(i, "ValueError", f"bad {i}")
    asyncio.run(go())


def _first_run(output, key):
    run = open_run(output, run_key=key, total=N)
    _hand(run, [(i, i not in BAD) for i in range(N)])
    run.close()


def _finish(run) -> None:
    _hand(run, [(i, True) for i in range(N) if not run.is_settled(i)])
    run.close()


def _rows(output) -> list[dict]:
    if output.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [
            {
                "index": r["index"],
                **({"error": r["error_type"]} if r["error_type"] else {"result": r["result"]}),
            }
            for r in pq.read_table(output).to_pylist()
        ]
    return [json.loads(line) for line in output.read_text().splitlines()]


def _once_no_errors(output) -> None:
    rows = _rows(output)
    assert sorted(r["index"] for r in rows) == list(range(N))
    assert not [r for r in rows if "error" in r]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_the_error_rows_are_made_again_and_the_good_rows_kept(job, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    tmp, inp, fn = job
    output = tmp / f"out{suffix}"
    _first_run(output, _key(inp, fn))
    good = [r for r in _rows(output) if "error" not in r]
    fn.write_text("def f(r): return r  # fixed\n")
    retry = open_retry(
        output, ledger_path=default_ledger_path(output), run_key=_key(inp, fn), total=N
    )
    assert (retry.error_rows, retry.kept) == (len(BAD), N - len(BAD)) and retry.function_changed
    assert {i for i in range(N) if not retry.run.is_settled(i)} == BAD
    if suffix == ".jsonl":      # the error rows are already out: nothing is ever twice in the file
        assert [json.loads(line)["index"] for line in output.read_text().splitlines()] == \
            [r["index"] for r in good]
    _finish(retry.run)
    _once_no_errors(output)
    assert [r for r in _rows(output) if r["index"] not in BAD] == good
    assert not staging_path(output).exists() or suffix == ".jsonl"


def test_killed_after_the_ledger_step_the_output_still_explains_itself(job):
    """JSONL: the ledger makes the error records pending first; killed before the output is
    rewritten, the resume adopts the error rows again (as they were), and the same command retries
    them."""
    tmp, inp, fn = job
    output = tmp / "out.jsonl"
    key = _key(inp, fn)
    _first_run(output, key)
    held = output.read_bytes()
    led = Ledger(default_ledger_path(output), run_key=key)
    led.reopen(sorted(BAD))                 # step 1 done, step 2 not
    led.close()
    run = open_run(output, run_key=key, total=N)
    assert run.report.complete and run.report.adopted == len(BAD) and output.read_bytes() == held
    assert run.counts().written_errors == len(BAD)
    run.close()
    retry = open_retry(output, ledger_path=default_ledger_path(output), run_key=key, total=N)
    _finish(retry.run)
    _once_no_errors(output)


def test_parquet_killed_after_the_staging_step_leaves_the_finished_file_as_it_was(job):
    """A finished Parquet output: its good rows go to the staging file first; killed before the
    ledger step, the ledger still says finalized, and the resume removes the staging file."""
    pytest.importorskip("pyarrow")
    tmp, inp, fn = job
    output = tmp / "out.parquet"
    key = _key(inp, fn)
    _first_run(output, key)
    held = output.read_bytes()
    staging_path(output).write_text('{"index": 1, "result": {"v": 1, "k": "x"}}\n')
    run = open_run(output, run_key=key, total=N)
    assert run.report.complete and output.read_bytes() == held and not staging_path(output).exists()
    run.close()


def test_a_retry_refuses_what_it_cannot_do_safely(job):
    tmp, inp, fn = job
    output = tmp / "out.jsonl"
    with pytest.raises(ForgeError, match="--retry-errors has no earlier run to retry"):
        open_retry(output, ledger_path=default_ledger_path(output), run_key=_key(inp, fn), total=N)
    assert not output.exists()
    _first_run(output, _key(inp, fn))
    held = output.read_bytes()
    with pytest.raises(ForgeError, match=r"belongs to another run \(function was fn.py:f, now "
                                         r"fn.py:g"):
        open_retry(
            output,
            ledger_path=default_ledger_path(output),
            run_key=_key(inp, fn, name="g"),
            total=N,
        )
    # a ledger rebuilt from its output cannot say which function made the rows
    for p in tmp.glob("out.jsonl.ledger.sqlite*"):
        p.unlink()
    with pytest.raises(ForgeError, match="cannot keep its good rows: it has no ledger"):
        open_retry(output, ledger_path=default_ledger_path(output), run_key=_key(inp, fn), total=N)
    open_run(output, run_key=_key(inp, fn), total=N).close()  # a plain run rebuilds the ledger ...
    # ... which cannot say
    with pytest.raises(ForgeError, match="its ledger was rebuilt from the output"):
        open_retry(output, ledger_path=default_ledger_path(output), run_key=_key(inp, fn), total=N)
    assert output.read_bytes() == held
