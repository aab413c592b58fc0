"""`kill -9` of the real `python -m forge run` at seeded random moments, rerun until complete.

Most kill points use the paced instant engine (no model, ~1,400 records/s, so a run lasts long
enough to be killed in the middle); a few use the real tiny engine (node_descriptions/local.yaml).
After the last run: every input line is in the output exactly once with the row an uninterrupted run
gives, the ledger agrees (all written, nothing stored, error rows counted), and no run generated a
record that was settled (in the ledger or the output) when it started."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from forge.constants import EXIT_ERROR_ROWS
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    kill9,
    read_rows,
    record_figures,
    resume_report,
    run_argv,
    settled_now,
    start,
    wait_for_growth,
    write_echo_input,
)

# None = forge's embedded default node: the tiny model through the transformers backend
REAL_NODE = None


def kill_loop(
    tmp: Path,
    *,
    node,
    n: int,
    kills: int,
    seed: int,
    mid_delay_s: float,
    early_window_s: float,
    max_tokens: int = 8,
    run_timeout_s: float = 120,
) -> dict:
    """Kill `kills` runs at random points, then let one finish; returns what happened."""
    inp = write_echo_input(tmp / "in.jsonl", n, bad_every=250)
    out, ledger, log = tmp / "out.jsonl", tmp / "out.jsonl.ledger.sqlite", tmp / "invocations.log"
    rng = random.Random(seed)
    settled_before: dict[int, set[int]] = {}
    points, reports = [], []
    run_id = killed = 0
    t0 = time.monotonic()
    while True:
        run_id += 1
        assert run_id <= 3 * kills + 5, (
            f"the input ran out before {kills} kills ({killed} so far): use more records"
        )
        settled_before[run_id] = settled_now(out, ledger)
        size0 = out.stat().st_size if out.exists() else 0
        err = tmp / f"run{run_id}.err"
        proc = start(
            run_argv(ECHO, inp, out, node),
            stderr_path=err,
            env_extra={
                "FORGE_TEST_INVOCATIONS": str(log),
                "FORGE_TEST_RUN_ID": str(run_id),
                "FORGE_TEST_MAX_TOKENS": str(max_tokens),
            },
        )
        if killed < kills:
            # anywhere: imports, engine load, ledger open, reconcile, recovery
            if rng.random() < 0.2:
                where, delay = "start-up", rng.uniform(0.0, early_window_s)
                time.sleep(delay)
            else:  # mid-run: rows being committed, written, fsync'ed, marked
                where, delay = "mid-run", rng.uniform(0.0, mid_delay_s)
                wait_for_growth(out, proc, beyond=size0, timeout_s=run_timeout_s)
                time.sleep(delay)
            rows_at_kill = len(settled_now(out, ledger))
            if kill9(proc):
                killed += 1
                points.append(
                    {
                        "run": run_id,
                        "where": where,
                        "delay_s": round(delay, 3),
                        "settled": rows_at_kill,
                    }
                )
                reports.append(resume_report(err.read_text()))
                continue
        rc = proc.wait(timeout=run_timeout_s)
        text = err.read_text()
        # complete; echo fails some records and some lines are malformed
        assert rc == EXIT_ERROR_ROWS, text
        assert_no_traceback(text)
        reports.append(resume_report(text))
        if killed >= kills:
            break
    # every input line exactly once, the ledger agrees
    summary = assert_complete(out, ledger, n)
    # no run generated a record that was settled when it started
    regenerated = []
    for line in log.read_text().splitlines():
        rid, index = map(int, line.split())
        if index in settled_before[rid]:
            regenerated.append((rid, index))
    assert regenerated == []
    return {
        "kills": killed,
        "runs": run_id,
        "points": points,
        "ledger": summary,
        "wall_s": time.monotonic() - t0,
        "recovered": sum(r["recovered"] for r in reports),
        "torn_bytes": sum(r["torn_bytes"] for r in reports),
        "output": out,
        "input": inp,
    }


def _reference(tmp: Path, inp: Path) -> dict[int, dict]:
    """The rows of one uninterrupted run (the instant engine is deterministic)."""
    out = tmp / "reference.jsonl"
    proc = start(
        run_argv(ECHO, inp, out, NODES / "instant.yaml"), stderr_path=tmp / "reference.err"
    )
    assert proc.wait(timeout=120) == EXIT_ERROR_ROWS, (tmp / "reference.err").read_text()
    return {r["index"]: r for r in read_rows(out)}


def _check_against_reference(result: dict, tmp: Path) -> None:
    want = _reference(tmp, result["input"])
    got = {r["index"]: r for r in read_rows(result["output"])}
    assert got == want


def _instant_kills(tmp_path: Path, kills: int, name: str) -> None:
    n = 600 * kills  # ~0.4 s of paced work per kill, and plenty left for the last run
    result = kill_loop(tmp_path, node=NODES / "paced.yaml", n=n, kills=kills, seed=20261129,
                       mid_delay_s=0.35, early_window_s=0.6)
    assert result["kills"] == kills
    _check_against_reference(result, tmp_path)
    mid = sum(p["where"] == "mid-run" for p in result["points"])
    assert mid >= kills // 2
    record_figures(
        name,
        engine="instant (paced, no model)",
        records=n,
        kills=result["kills"],
        mid_run=mid,
        runs=result["runs"],
        recovered_from_ledger=result["recovered"],
        torn_bytes_cut=result["torn_bytes"],
        retried_records=result["ledger"]["retried"],
        error_rows=result["ledger"]["errors"],
        wall_s=round(result["wall_s"], 1),
        points=result["points"],
    )


@pytest.mark.timeout(240)
def test_kill9_forge_run_25_times_instant_engine(tmp_path):
    _instant_kills(tmp_path, 25, "kill9-instant")


@pytest.mark.long
@pytest.mark.timeout(600)
def test_kill9_forge_run_100_times_instant_engine(tmp_path):
    _instant_kills(tmp_path, 100, "kill9-instant-long")


def _real_kills(tmp_path: Path, kills: int, name: str, n: int) -> None:
    result = kill_loop(
        tmp_path,
        node=REAL_NODE,
        n=n,
        kills=kills,
        seed=7,
        mid_delay_s=1.5,
        early_window_s=6.0,
        max_tokens=4,
        run_timeout_s=300,
    )
    rows = read_rows(result["output"])
    for row in rows:  # the model's words vary with batching; the shape not
        if "result" in row:
            assert row["result"]["id"] == row["index"] and 0 < row["result"]["tokens"] <= 4
        else:
            assert row["error"]["type"] in ("ValueError", "InputInvalidJSON")
    record_figures(
        name,
        engine="transformers (tiny real model)",
        records=n,
        kills=result["kills"],
        runs=result["runs"],
        recovered_from_ledger=result["recovered"],
        torn_bytes_cut=result["torn_bytes"],
        retried_records=result["ledger"]["retried"],
        error_rows=result["ledger"]["errors"],
        wall_s=round(result["wall_s"], 1),
        points=result["points"],
    )


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_kill9_forge_run_real_tiny_engine(tmp_path):
    _real_kills(tmp_path, 2, "kill9-real", n=400)


@pytest.mark.engine
@pytest.mark.long
@pytest.mark.timeout(900)
def test_kill9_forge_run_real_tiny_engine_long(tmp_path):
    _real_kills(tmp_path, 8, "kill9-real-long", n=1500)
