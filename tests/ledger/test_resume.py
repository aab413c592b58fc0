"""The resume protocol, one crash boundary at a time. Each test builds the files a run killed at
that boundary leaves behind (using the same Ledger and OutputWriter the committer uses, stopped
after the step in question), then resumes and checks: every index once, nothing regenerated that
was settled, the ledger agreeing with the output."""
from __future__ import annotations

import asyncio
import errno
import json

import pytest

from forge.errors import ForgeError
from forge.ledger import (
    Ledger,
    LedgerMismatch,
    default_ledger_path,
    make_run_key,
    open_run,
    staging_path,
)
from forge.records import OutputWriter, encode_result, open_records
from tests.ledger.runs import put_all

N = 20


@pytest.fixture
def job(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(N)))
    (tmp_path / "fn.py").write_text("def f(r): return r\n")
    source = open_records(tmp_path / "in.jsonl")
    key = make_run_key(function_file=tmp_path / "fn.py", function_name="f", source=source)
    return tmp_path / "out.jsonl", key


def _row(i):
    return encode_result(i, {"v": i})[0]


def _finish(output, key, **kw):
    """Resume and complete the run the way the runner does; returns (report, regenerated
    indices)."""
    run = open_run(output, run_key=key, total=N, **kw)
    todo = [i for i in range(N) if not run.is_settled(i)]
    put_all(run, [(i, {"v": i}) for i in todo], attempts=True)
    report = run.close()
    return report, todo


def _check_output(output):
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(N))
    assert all(r["result"] == {"v": r["index"]} for r in rows)
    led = Ledger(default_ledger_path(output), run_key=_check_output.key)
    counts = led.counts()
    led.close()
    assert counts.written == N and counts.done == counts.failed == counts.pending == 0


def _crash_after(output, key, *, committed=(), written=(), marked=(), torn_bytes=0, attempts=()):
    """Leave the files of a run killed after: attempts, ledger commit of `committed`, output write
    of `written` (optionally torn: the last `torn_bytes` cut), and marking `marked` written."""
    led = Ledger(default_ledger_path(output), run_key=key)
    led.apply(attempts=attempts, settled=[(i, _row(i), False) for i in committed])
    w = OutputWriter(output)
    if written:
        w.append([_row(i) for i in written])
        if torn_bytes:
            w.truncate(output.stat().st_size - torn_bytes)
    led.apply(written=[(i, False) for i in marked])
    w.close()
    led.close()
    _check_output.key = key


def test_killed_before_the_ledger_commit_regenerates_only_those(job):
    output, key = job
    _crash_after(
        output, key, attempts=range(10), committed=range(5), written=range(5), marked=range(5)
    )
    report, regenerated = _finish(output, key)
    assert regenerated == list(range(5, N)) and report.already_written == 5
    _check_output(output)
    led = Ledger(default_ledger_path(output), run_key=key)
    assert led.counts().retried == 5        # 5..9 were invoked in both runs
    led.close()


def test_killed_after_commit_before_write_writes_from_the_ledger(job):
    output, key = job
    _crash_after(output, key, committed=range(8))
    report, regenerated = _finish(output, key)
    assert report.recovered == 8 and regenerated == list(range(8, N))
    _check_output(output)


def test_killed_mid_write_cuts_the_torn_line_and_rewrites_it_from_the_ledger(job):
    output, key = job
    _crash_after(output, key, committed=range(8), written=range(8), torn_bytes=7)
    report, regenerated = _finish(output, key)
    assert report.truncated_bytes > 0 and report.adopted == 7 and report.recovered == 1
    assert regenerated == list(range(8, N))
    _check_output(output)


def test_killed_after_fsync_before_mark_adopts_the_output_rows(job):
    output, key = job
    _crash_after(output, key, committed=range(8), written=range(8), marked=range(3))
    report, regenerated = _finish(output, key)
    assert report.adopted == 5 and report.recovered == 0 and regenerated == list(range(8, N))
    _check_output(output)


def test_ledger_behind_the_output_after_a_power_loss_adopts_the_rows(job):
    # synchronous=NORMAL may lose the last commits on power loss, never the fsync'ed output
    output, key = job
    _crash_after(output, key, attempts=range(4), written=range(6))
    report, regenerated = _finish(output, key)
    assert report.adopted == 6 and regenerated == list(range(6, N))
    _check_output(output)


def test_ctrl_c_close_drains_what_was_handed_over(job):
    output, key = job
    run = open_run(output, run_key=key, total=N)
    put_all(run, [(i, {"v": i}) for i in range(0, N, 2)])
    run.close()                     # the runner's finally: on KeyboardInterrupt
    assert len(output.read_text().splitlines()) == N // 2
    report, regenerated = _finish(output, key)
    assert regenerated == list(range(1, N, 2)) and report.already_written == N // 2
    _check_output(output)


def test_a_complete_run_has_nothing_to_do(job):
    output, key = job
    _finish(output, key)
    run = open_run(output, run_key=key, total=N)
    assert run.report.complete and run.report.already_written == N
    assert all(run.is_settled(i) for i in range(N))
    report = run.close()
    assert report.complete and run.counts().written == N        # counts stay readable after close
    _check_output(output)


def test_output_without_its_ledger_is_refused_unless_restart(job):
    output, key = job
    output.write_text(_row(0) + "\n")
    with pytest.raises(ForgeError, match=r"already holds 1 rows but its ledger .* is new; .*pass "
                                         r"--restart"):
        open_run(output, run_key=key, total=N)
    _finish(output, key, restart=True)
    _check_output(output)


def test_rows_removed_from_the_output_are_refused(job):
    output, key = job
    _finish(output, key)
    lines = output.read_text().splitlines()
    output.write_text("\n".join(lines[:-2]) + "\n")
    with pytest.raises(ForgeError, match=r"2 rows the ledger recorded as written are missing"):
        open_run(output, run_key=key, total=N)


def test_output_from_a_longer_input_is_refused(job):
    output, key = job
    _crash_after(output, key, committed=[N + 3], written=[N + 3], marked=[N + 3])
    with pytest.raises(ForgeError, match=rf"has a row for index {N + 3} but the input has only {N} "
                                         r"records"):
        open_run(output, run_key=key, total=N)


def test_another_function_or_input_is_refused(job):
    output, key = job
    _finish(output, key)
    with pytest.raises(LedgerMismatch, match="input_size was"):
        open_run(output, run_key={**key, "input_size": 1}, total=N)


def test_a_second_run_on_the_same_output_is_refused(job):
    output, key = job
    run = open_run(output, run_key=key, total=N)
    with pytest.raises(ForgeError, match="another forge run"):
        open_run(output, run_key=key, total=N, ledger_path=output.with_name("other.sqlite"))
    run.close()


def test_duplicates_are_reported(job):
    output, key = job
    _crash_after(output, key, committed=[1], written=[1, 1], marked=[1])
    run = open_run(output, run_key=key, total=N)
    assert run.report.duplicates == 1 and run.report.first_duplicates == (1,)
    run.close()


def test_async_producers_wait_for_a_full_queue_and_lose_nothing(job):
    output, key = job
    run = open_run(output, run_key=key, total=N)
    run.committer.max_queue_rows = 2        # force back-pressure

    async def produce():
        await asyncio.gather(*(run.aput_result(i, {"v": i}) for i in range(N)))
        await run.aput_attempt(0)

    asyncio.run(produce())
    run.close()
    _check_output(output)


def test_a_failing_disk_stops_the_run_with_one_clear_line(job, monkeypatch):
    output, key = job

    def full(self, lines):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(OutputWriter, "append", full)
    run = open_run(output, run_key=key, total=N)
    with pytest.raises(ForgeError, match="out.jsonl: cannot write the output: No space left on "
                                         "device"):
        put_all(
            run, [(i, {"v": i}) for i in range(N)], between=lambda: run.committer._thread.join(0.01)
        )
        run.close()
    with pytest.raises(ForgeError, match="No space left"):
        run.close()
    monkeypatch.undo()
    report, regenerated = _finish(output, key)
    # committed rows not redone
    assert report.recovered > 0 and len(regenerated) == N - report.recovered
    _check_output(output)


def test_parquet_output_is_made_when_the_run_completes(job):
    pq = pytest.importorskip("pyarrow.parquet")
    output, key = job
    output = output.with_suffix(".parquet")
    run = open_run(output, run_key=key, total=N)
    put_all(run, [(i, {"v": i}) for i in range(N - 1)])
    run.close()
    assert not output.exists() and staging_path(output).exists()        # incomplete: staging only
    report, regenerated = _finish(output, key)
    assert report.complete and regenerated == [N - 1]
    assert not staging_path(output).exists()
    assert sorted(pq.read_table(output).column("index").to_pylist()) == list(range(N))
    run = open_run(output, run_key=key, total=N)
    assert run.report.complete and all(run.is_settled(i) for i in range(N))
    with pytest.raises(ForgeError, match="already complete"):
        put_all(run, [(0, {})])
    assert run.close().complete and run.counts().written == N


def test_commits_are_batched_and_starts_are_counted(tmp_path):
    output = tmp_path / "out.jsonl"
    run = open_run(output, run_key={"k": 1}, total=5000, info={"node": "local"})
    put_all(run, [(i, i) for i in range(5000)], attempts=True)
    run.close()
    # 10000 queue items + 5000 written marks, at most 2048 + marks per transaction
    assert run.stats.rows_committed == 15000 and run.stats.commits <= 100   # not one per row
    led = Ledger(default_ledger_path(output), run_key={"k": 1})
    assert led.starts == 2 and json.loads(led.get_meta("info")) == {}
    led.close()
    led = Ledger(default_ledger_path(output), run_key={"k": 1}, info={"node": "n2"})
    assert led.starts == 3 and json.loads(led.get_meta("info")) == {"node": "n2"}
    led.close()
