"""Faults injected into real runs (`forge run` in a subprocess, the `faults` backend around a real
engine): an engine that crashes, refuses, slows down, freezes for a while or for good; a producer
(the function's process) that dies; user code that tries to exit. Each run ends in a defined state
with one clear line, and a rerun finishes the output with every record exactly once."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from forge.constants import EXIT_ERROR_ROWS, EXIT_INCOMPLETE, EXIT_OK
from tests.reliability._rel import (
    ECHO,
    FUNCTIONS,
    NODES,
    assert_complete,
    assert_no_traceback,
    ledger_summary,
    read_rows,
    record_figures,
    resume_report,
    run_argv,
    start,
    write_echo_input,
)

pytestmark = pytest.mark.timeout(180)
RESUME_MESSAGE = "run the same command again to resume"


def _run(
    tmp: Path,
    node,
    *,
    n: int = 2000,
    target=ECHO,
    report: bool = False,
    env_extra=None,
    name="run",
    timeout_s: float = 120,
    inp: Path | None = None,
):
    inp = inp or write_echo_input(tmp / "in.jsonl", n)
    out = tmp / "out.jsonl"
    argv = run_argv(target, inp, out, node)
    if report:
        argv.remove("--no-report")
    err = tmp / f"{name}.err"
    t0 = time.monotonic()
    proc = start(argv, stderr_path=err, env_extra=env_extra)
    rc = proc.wait(timeout=timeout_s)
    text = err.read_text()
    assert_no_traceback(text)
    report_data = (
        json.loads(out.with_name(out.name + ".report.json").read_text())
        if report and rc in (EXIT_OK, EXIT_ERROR_ROWS, EXIT_INCOMPLETE)
        else None
    )
    return inp, out, rc, text, time.monotonic() - t0, report_data


def _finish_on_healthy_node(tmp: Path, inp: Path, out: Path, n: int, target=ECHO) -> dict:
    _, _, rc, text, _, _ = _run(tmp, NODES / "instant.yaml", inp=inp, target=target, name="resume")
    # echo fails id % 97 == 13 on purpose
    assert rc == (EXIT_ERROR_ROWS if target == ECHO else EXIT_OK), text
    ledger = assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), n)
    return {"report": resume_report(text), "ledger": ledger}


def test_engine_crash_mid_run_stops_with_one_line_and_resumes(tmp_path):
    inp, out, rc, text, took, _ = _run(tmp_path, NODES / "crash.yaml")
    assert rc == EXIT_INCOMPLETE, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("forge: stopped: node crash: no engine can work (cpu0: engine failed: "
                           "injected crash "
                           "after 300 results)") and RESUME_MESSAGE in last, text
    ledger = ledger_summary(out.with_name(out.name + ".ledger.sqlite"))
    results = sum("result" in r for r in read_rows(out))
    assert results == 300  # exactly what the engine delivered before it died
    assert ledger["states"].get("pending", 0) > 0 and set(ledger["states"]) <= {
        "written",
        "pending",
    }
    after = _finish_on_healthy_node(tmp_path, inp, out, 2000)
    record_figures(
        "fault-crash",
        exit_code=rc,
        stop_s=round(took, 2),
        results_before_crash=results,
        pending_after_crash=ledger["states"]["pending"],
        retried_on_resume=after["ledger"]["retried"],
        resumed_complete=True,
    )


def test_engine_refusals_are_retried_with_backoff(tmp_path):
    inp, out, rc, text, took, rep = _run(tmp_path, NODES / "refuse.yaml", report=True)
    assert rc == EXIT_ERROR_ROWS, text
    card = rep["cards"][0]
    assert card["admission_refusals"] == 5 and card["retries"] == 5
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), 2000)
    record_figures(
        "fault-refuse",
        exit_code=rc,
        refusals=card["admission_refusals"],
        retries=card["retries"],
        complete=True,
    )


def _slowdown(
    tmp_path, fast_node, slow_node, n: int, env_extra=None, timeout_s: float = 120
) -> tuple[dict, dict]:
    base = tmp_path / "baseline"
    base.mkdir()
    _, _, rc0, text0, _, rep0 = _run(
        base, fast_node, n=n, report=True, env_extra=env_extra, timeout_s=timeout_s
    )
    assert rc0 == EXIT_ERROR_ROWS, text0
    inp, out, rc, text, took, rep = _run(tmp_path, slow_node, n=n, report=True, env_extra=env_extra,
                                         timeout_s=timeout_s)
    assert rc == EXIT_ERROR_ROWS, text
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), n)
    card = rep["cards"][0]
    # slow is not mistaken for stalled
    assert card["stalls"] == 0 and card["requests"]["requeued"] == 0
    return rep0, rep


def test_engine_that_slows_down_still_finishes_everything(tmp_path):
    """slow_factor holds every result back 4x as long as the inner engine took. Around the instant
    engine that costs little (its answers take microseconds; the control plane dominates), so this
    checks the outcome; the real engine, where it bites, is the --long variant below."""
    rep0, rep = _slowdown(tmp_path, NODES / "instant.yaml", NODES / "slowdown.yaml", 5000)
    record_figures(
        "fault-slowdown",
        engine="instant",
        slow_factor=4.0,
        wall_s=round(rep["summary"]["wall_s"], 2),
        baseline_wall_s=round(rep0["summary"]["wall_s"], 2),
        complete=True,
        stalls=0,
        requeued=0,
    )


@pytest.mark.engine
@pytest.mark.long
@pytest.mark.timeout(600)
def test_real_tiny_engine_that_slows_down(tmp_path):
    rep0, rep = _slowdown(
        tmp_path,
        None,
        NODES / "real-slow.yaml",
        300,
        env_extra={"FORGE_TEST_MAX_TOKENS": "8"},
        timeout_s=400,
    )
    slower = rep["summary"]["wall_s"] / rep0["summary"]["wall_s"]
    assert slower > 1.5, (rep["summary"]["wall_s"], rep0["summary"]["wall_s"])
    record_figures(
        "fault-slowdown-real",
        engine="transformers (tiny)",
        slow_factor=3.0,
        wall_s=round(rep["summary"]["wall_s"], 1),
        baseline_wall_s=round(rep0["summary"]["wall_s"], 1),
        slower=round(slower, 2),
        complete=True,
        stalls=0,
        requeued=0,
    )


def test_engine_that_freezes_for_a_while_recovers_without_loss(tmp_path):
    inp, out, rc, text, took, rep = _run(tmp_path, NODES / "freeze-brief.yaml", report=True)
    assert rc == EXIT_ERROR_ROWS, text
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), 2000)
    assert rep["summary"]["wall_s"] >= 1.5
    record_figures(
        "fault-freeze-brief",
        exit_code=rc,
        freeze_s=1.5,
        wall_s=round(rep["summary"]["wall_s"], 2),
        stalls=rep["cards"][0]["stalls"],
        complete=True,
    )


def test_engine_that_freezes_for_good_is_taken_back_then_the_node_stops(tmp_path, capsys):
    """The same job path as `forge run` (store, ledger, runner, node) in this process, with a 0.5 s
    stall window instead of the default 30 s so it fits the default run; the CLI with the real
    window is a --long test."""
    from forge.config.load import load_node
    from forge.functions.job import JobOptions, run_with_node
    from forge.node.local import LocalNode

    inp = write_echo_input(tmp_path / "in.jsonl", 2000)
    out = tmp_path / "out.jsonl"
    opts = JobOptions(
        target=str(ECHO),
        input_path=inp,
        output_path=out,
        ledger_path=Path(f"{out}.ledger.sqlite"),
        progress="off",
        report=False,
    )
    nodes = []

    def make_node():
        nodes.append(LocalNode(load_node(NODES / "freeze.yaml"), stall_window_s=0.5))
        return nodes[0]

    t0 = time.monotonic()
    rc = run_with_node(make_node, opts)
    stats = nodes[0].engine_stats()
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == EXIT_INCOMPLETE, err
    assert "no engine can work (cpu0: wedged)" in err and RESUME_MESSAGE in err, err
    (card,) = stats
    assert card.stalls >= 1 and card.progress_only_steps >= 1 and card.requests_requeued >= 1
    results = sum("result" in r for r in read_rows(out))
    assert results == 200
    after = _finish_on_healthy_node(tmp_path, inp, out, 2000)
    record_figures("fault-freeze-forever", exit_code=rc, stop_s=round(took, 1), stall_window_s=0.5,
                   stalls=card.stalls, progress_only_steps=card.progress_only_steps,
                   taken_back=card.requests_requeued, results_before_freeze=results,
                   retried_on_resume=after["ledger"]["retried"], resumed_complete=True)


@pytest.mark.long
@pytest.mark.timeout(600)
def test_engine_that_freezes_for_good_cli_default_stall_window(tmp_path):
    inp, out, rc, text, took, _ = _run(tmp_path, NODES / "freeze.yaml", timeout_s=500)
    assert rc == EXIT_INCOMPLETE, text
    assert "no engine can work (cpu0: wedged)" in text and RESUME_MESSAGE in text, text
    _finish_on_healthy_node(tmp_path, inp, out, 2000)
    record_figures(
        "fault-freeze-forever-cli", exit_code=rc, stop_s=round(took, 1), stall_window_s=30
    )


@pytest.mark.engine
@pytest.mark.long
@pytest.mark.timeout(600)
def test_real_tiny_engine_crash_mid_run(tmp_path):
    inp, out, rc, text, took, _ = _run(tmp_path, NODES / "real-crash.yaml", n=300, timeout_s=300,
                                       env_extra={"FORGE_TEST_MAX_TOKENS": "4"})
    assert rc == EXIT_INCOMPLETE, text
    assert "injected crash after 60 results" in text and RESUME_MESSAGE in text, text
    assert sum("result" in r for r in read_rows(out)) == 60
    _finish_on_healthy_node(tmp_path, inp, out, 300)
    record_figures("fault-crash-real", exit_code=rc, stop_s=round(took, 1), results_before_crash=60)


def test_user_code_that_exits_fails_only_its_records(tmp_path):
    inp, out, rc, text, took, _ = _run(
        tmp_path, NODES / "instant.yaml", n=500, target=FUNCTIONS / "exits.py"
    )
    assert rc == EXIT_ERROR_ROWS, text
    rows = {r["index"]: r for r in read_rows(out)}
    assert sorted(rows) == list(range(500))
    kinds = {3: "SystemExit", 5: "KeyboardInterrupt", 7: "Escape"}
    for i, row in rows.items():
        if i % 10 in kinds:
            assert row["error"]["type"] == kinds[i % 10] and "exits.py" in row["error"]["message"]
        else:
            assert "result" in row
    record_figures(
        "producer-exits",
        exit_code=rc,
        error_rows=sum("error" in r for r in rows.values()),
        records=500,
    )


def test_producer_process_that_dies_abruptly_loses_nothing(tmp_path):
    inp, out, rc, text, took, _ = _run(
        tmp_path,
        NODES / "paced.yaml",
        n=3000,
        target=FUNCTIONS / "dies.py",
        env_extra={"FORGE_TEST_DIE_AT": "1500"},
    )
    assert rc == 70, text  # os._exit: no message can be printed; the ledger holds the state
    before = len(read_rows(out)) if out.exists() else 0
    after = _finish_on_healthy_node(tmp_path, inp, out, 3000, target=FUNCTIONS / "dies.py")
    record_figures(
        "producer-dies",
        exit_code=rc,
        rows_before=before,
        recovered=after["report"]["recovered"],
        retried_on_resume=after["ledger"]["retried"],
        resumed_complete=True,
    )
