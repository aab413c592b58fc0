"""What a job checks and counts, as a newcomer meets it (real CLI in a subprocess, the instant
engine unless said): a result that cannot be serialised is a failed record, not a done one;
everything that can refuse a job is checked before any engine loads; a finished rerun answers at
once; a changed function is refused with a path that keeps the finished rows."""
import functools
import json

import pytest

from tests.forge_cli import forge as forge_process
from tests.reliability._rel import NODES, assert_complete, read_rows, write_echo_input

FIXTURES = __import__("pathlib").Path(__file__).resolve().parent / "fixtures"
REPO = FIXTURES.parents[2]


# `forge ARGS` with -X importtime: `.torch_loaded` says whether an engine library was imported.
forge = functools.partial(forge_process, importtime=True, timeout=180)


def test_a_result_that_cannot_be_serialised_is_counted_failed(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", 10)
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        FIXTURES / "unserialisable.py",
        "--node",
        NODES / "instant.yaml",
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
    )
    assert r.returncode == 3, r.message                  # complete, with error rows
    rows = {row["index"]: row for row in read_rows(out)}
    assert all(rows[i]["error"]["type"] == "SerializationError" for i in range(1, 10, 2))
    assert ": 5 done, 5 failed," in r.message, r.message
    report = json.loads(out.with_name("out.jsonl.report.json").read_text())
    assert (report["summary"]["records_done"], report["summary"]["records_failed"]) == (5, 5)
    assert (report["summary"]["error_rows"], report["summary"]["exit"]) == (5, 3)
    run = report["series"]["run"]
    # read and written: queues empty
    assert run["producer_queue"][-1] == 0 and run["writer_queue"][-1] == 0


@pytest.mark.engine
def test_refusals_come_before_the_engine_loads(tmp_path):
    """On the real embedded node: a missing input, a finished rerun and a changed function are
    answered without importing torch (each used to cost the engine's load first)."""
    fn = tmp_path / "fn.py"
    fn.write_text((REPO / "functions/summarize.py").read_text())
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "".join((REPO / "functions/data/summarize.jsonl").read_text().splitlines(True)[:3])
    )
    out = tmp_path / "out.jsonl"

    missing = forge("run", fn, "--input", tmp_path / "nope.jsonl", "--output", out)
    assert missing.returncode == 1 and not missing.torch_loaded
    assert missing.message.endswith("nope.jsonl: input file does not exist")

    first = forge("run", fn, "--input", inp, "--output", out, "--progress", "off")
    assert first.returncode == 0 and first.torch_loaded, first.message
    report = out.with_name("out.jsonl.report.json")
    before = report.read_bytes()

    again = forge("run", fn, "--input", inp, "--output", out, cwd=tmp_path)
    assert again.returncode == 0 and not again.torch_loaded
    assert again.message == ("forge: out.jsonl is already complete: all 3 records are in it (0 of "
                             "them error rows); "
                             "nothing to do (--restart runs it again)")
    assert report.read_bytes() == before  # the report of the run that did the work stays

    fn.write_text(fn.read_text() + "# a comment is a change\n")
    changed = forge("run", fn, "--input", inp, "--output", out, cwd=tmp_path)
    assert changed.returncode == 1 and not changed.torch_loaded
    assert "forge: out.jsonl.ledger.sqlite: the function file changed since this run started (fn.py:summarize: " \
           "function_sha256 was " in changed.message
    assert changed.message.endswith("if the change leaves the 3 finished row(s) valid, pass "
                                    "--accept-changed-function "
                                    "to keep them and run the rest with the new code; --restart "
                                    "discards the output "
                                    "and starts over")
    assert "--ledger" not in changed.message


SLOW_THEN_FIXED = '''
import asyncio
import forge

SLOW = {slow}


@forge.function(max_output_tokens=4)
async def f(record: dict, llm: forge.LLM) -> dict:
    await llm.generate(f"record {{record['id']}}", max_tokens=2)
    if SLOW and record["id"] >= 4:
        await asyncio.sleep(60)
    return {{"id": record["id"], "version": {version}}}
'''


def test_a_compatible_change_keeps_the_finished_rows_and_runs_the_rest(tmp_path):
    import signal
    import time

    from tests.reliability._rel import forge_argv, kill9, start

    fn = tmp_path / "fn.py"
    fn.write_text(SLOW_THEN_FIXED.format(slow=True, version=1))
    inp = write_echo_input(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out.jsonl"
    proc = start(
        forge_argv(
            "run",
            fn,
            "--node",
            NODES / "instant.yaml",
            "--input",
            inp,
            "--output",
            out,
            "--concurrency",
            4,
            "--progress",
            "off",
        ),
        stderr_path=tmp_path / "e",
    )
    try:
        t0 = time.monotonic()
        while (
            not out.exists() or len(out.read_text().splitlines()) < 4
        ) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        assert proc.wait(timeout=30) == 130, (tmp_path / "e").read_text()
    finally:
        kill9(proc)
    assert sorted(r["index"] for r in read_rows(out)) == [0, 1, 2, 3]

    # the fix: same rows for done records
    fn.write_text(SLOW_THEN_FIXED.format(slow=False, version=2))
    refused = forge("run", fn, "--node", NODES / "instant.yaml", "--input", inp, "--output", out)
    assert refused.returncode == 1 and "--accept-changed-function" in refused.message
    kept = forge(
        "run",
        fn,
        "--node",
        NODES / "instant.yaml",
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--accept-changed-function",
    )
    assert kept.returncode == 0, kept.message
    assert "the function file changed; keeping the 4 record(s) already settled, as --accept-changed-function asks" \
        in kept.message
    # the 4 in flight at Ctrl-C ran again
    assert ": 26 done, 0 failed, 4 resumed, 4 retried" in kept.message
    rows = {r["index"]: r["result"] for r in read_rows(out)}
    assert sorted(rows) == list(range(30))
    assert [rows[i]["version"] for i in range(30)] == [1] * 4 + [2] * 26
    assert_complete(out, out.with_name("out.jsonl.ledger.sqlite"), 30)
    report = json.loads(out.with_name("out.jsonl.report.json").read_text())  # both starts, added up
    assert (report["summary"]["records_done"], report["summary"]["records_resumed"]) == (30, 0)
    assert [r["done"] for r in report["runs"]] == [4, 26] and report["runs"][0][
        "interrupted"
    ] == "SIGINT"
    assert report["totals"]["done"] == 30 and len(report["series"]["resumes_t_s"]) == 1
