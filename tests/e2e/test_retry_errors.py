"""`forge run ... --retry-errors` on the embedded node (the real tiny model through transformers, in
a node that `forge provision local` keeps up for the module, which each `forge run` uses): a
function that fails for some records is fixed, the retry makes only their rows again, keeps every
good row byte for byte, and leaves each index exactly once, also after a kill -9 in the middle of
the retry; what it cannot do safely is refused in one line."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.conformance._engines import EMBEDDED, ProvisionedNode

pytestmark = pytest.mark.slow

BUGGY = '''import asyncio
import forge


@forge.function(max_output_tokens=8, concurrency=4)
async def tag(record, llm):
    if record["id"] % 3 == 0:
        raise ValueError(f"no tag for {record['id']}")       # the bug the retry is for
    await asyncio.sleep(record.get("pause", 0))
    out = await llm.generate(record["text"], max_tokens=4)
    return {"id": record["id"], "tag": out.text}
'''
FIXED = BUGGY.replace('if record["id"] % 3 == 0:', 'if record["id"] < 0:')


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    folder = tmp_path_factory.mktemp("retry-node")
    up = ProvisionedNode(EMBEDDED / "local.yaml", folder)
    yield up
    up.stop()


def _job(tmp_path, n: int, *, pause: float = 0.0, suffix: str = ".jsonl"):
    fn, inp, out = tmp_path / "tag.py", tmp_path / "in.jsonl", tmp_path / f"out{suffix}"
    fn.write_text(BUGGY)
    inp.write_text(
        "".join(
            json.dumps({"id": i, "text": f"Alice met the Hatter {i} times", "pause": pause}) + "\n"
            for i in range(n)
        )
    )
    return fn, inp, out


def _argv(node, fn, inp, out, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "forge",
        "run",
        str(fn),
        "--node",
        "local",
        "--input",
        str(inp),
        "--output",
        str(out),
        "--progress",
        "off",
        "--no-report",
        *extra,
    ]


def _forge(node, *argv, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(
        argv, cwd=node.folder, env=node.env, capture_output=True, text=True, timeout=timeout
    )
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def _rows(out) -> list[dict]:
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(out).to_pylist()
        return [
            {
                "index": r["index"],
                **({"error": r["error_type"]} if r["error_type"] else {"result": r["result"]}),
            }
            for r in table
        ]
    return [json.loads(line) for line in out.read_text().splitlines()]


def _exactly_once(rows: list[dict], n: int) -> dict[int, dict]:
    by_index = {r["index"]: r for r in rows}
    assert len(rows) == n and sorted(by_index) == list(range(n)), "not every index exactly once"
    return by_index


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_fix_the_function_and_retry_only_the_error_rows(node, tmp_path, suffix):
    n = 30
    fn, inp, out = _job(tmp_path, n, suffix=suffix)
    first = _forge(node, *_argv(node, fn, inp, out))
    assert first.returncode == 3, first.stderr[-3000:]
    # the module's node: no engine load per run
    assert "using node 'local', already up" in first.stderr
    before = _exactly_once(_rows(out), n)
    bad = sorted(i for i, r in before.items() if "error" in r)
    assert bad == list(range(0, n, 3))
    good_lines = (set() if suffix == ".parquet" else
                  {line for line in out.read_text().splitlines() if '"error"' not in line})

    fn.write_text(FIXED)
    retry = _forge(node, *_argv(node, fn, inp, out, "--retry-errors"))
    assert retry.returncode == 0, retry.stderr[-3000:]
    said = next(line for line in retry.stderr.splitlines() if "--retry-errors" in line)
    assert f"--retry-errors: {len(bad)} error row(s) taken out of " in said and (
        f"out{suffix} to be made again; its {n - len(bad)} good row(s) are kept as they are (the "
        "function file "
        "changed since the rows were made (tag.py:tag))") in said, retry.stderr
    assert f"tag on local: {len(bad)} done, 0 failed, {n - len(bad)} resumed" in retry.stderr
    after = _exactly_once(_rows(out), n)
    assert not any("error" in r for r in after.values())
    assert {i: after[i] for i in before if i not in bad} == {
        i: before[i] for i in before if i not in bad
    }
    if suffix == ".jsonl":      # the good rows are the very same lines
        assert good_lines <= set(out.read_text().splitlines())
    else:
        assert not out.with_name(out.name + ".staging.jsonl").exists()
    with sqlite3.connect(out.with_name(out.name + ".ledger.sqlite")) as db:
        attempts = dict(db.execute("SELECT idx, attempts FROM records"))
        assert db.execute(
            "SELECT COUNT(*) FROM records WHERE state != 'written' OR is_error"
        ).fetchone() == (0,)
    assert {i for i, a in attempts.items() if a == 2} == set(bad)  # only the error rows ran again

    again = _forge(node, *_argv(node, fn, inp, out, "--retry-errors"))
    assert again.returncode == 0 and "is already complete" in again.stderr, again.stderr[-2000:]


def test_a_retry_killed_mid_way_then_run_again_keeps_every_index_once(node, tmp_path):
    n = 240
    # 80 records to retry, 4 at a time: ~2 s of retrying
    fn, inp, out = _job(tmp_path, n, pause=0.1)
    assert _forge(node, *_argv(node, fn, inp, out)).returncode == 3
    bad = {i for i, r in _exactly_once(_rows(out), n).items() if "error" in r}
    fn.write_text(FIXED)
    err = tmp_path / "retry.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            _argv(node, fn, inp, out, "--retry-errors"),
            cwd=node.folder,
            env=node.env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            text = out.read_text()
            rows = [json.loads(line) for line in text.splitlines() if line.endswith("}")]
            if '"error"' not in text and len(rows) >= n - len(bad) + 10:
                break  # the error rows are out and ten retried rows are in: mid-retry
            time.sleep(0.02)
        assert proc.poll() is None, (
            f"the retry ended before it could be killed: {err.read_text()[-2000:]}"
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    mid = [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")]
    # killed before the end, no index twice
    assert len(mid) < n and len({r["index"] for r in mid}) == len(mid)

    rerun = _forge(node, *_argv(node, fn, inp, out, "--retry-errors"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    after = _exactly_once(_rows(out), n)
    assert not any("error" in r for r in after.values())


def test_what_a_retry_cannot_do_safely_is_refused_in_one_line(node, tmp_path):
    fn, inp, out = _job(tmp_path, 6)
    none = _forge(node, *_argv(node, fn, inp, out, "--retry-errors"))
    assert none.returncode == 1 and not out.exists()
    last = none.stderr.strip().splitlines()[-1]
    assert "out.jsonl: --retry-errors has no earlier run to retry (no ledger " in last, none.stderr
    assert last.endswith("out.jsonl.ledger.sqlite); run without --retry-errors"), none.stderr
    assert _forge(node, *_argv(node, fn, inp, out)).returncode == 3
    held = out.read_bytes()

    both = _forge(node, *_argv(node, fn, inp, out, "--retry-errors", "--restart"))
    assert (
        both.returncode == 2
        and "give --retry-errors" in both.stderr
        and "or --restart" in both.stderr
    )

    # Another function's good rows are not this function's: the function's name is part of the
    # stored identity.
    fn.write_text(FIXED.replace("async def tag(", "async def label("))
    other = _forge(node, *_argv(node, fn, inp, out, "--retry-errors"))
    # the line before it says the run uses the module's node
    last = other.stderr.strip().splitlines()[-1]
    assert (
        other.returncode == 1
        and "this ledger belongs to another run (function was tag.py:tag, now tag.py:label" in last
    ), other.stderr
    # So is another input's.
    fn.write_text(FIXED)
    inp.write_text(inp.read_text() + json.dumps({"id": 6, "text": "one more"}) + "\n")
    grown = _forge(node, *_argv(node, fn, inp, out, "--retry-errors"))
    last = grown.stderr.strip().splitlines()[-1]
    assert (
        grown.returncode == 1
        and "this ledger belongs to another run (" in last
        and "input_size was" in last
    )
    assert out.read_bytes() == held
