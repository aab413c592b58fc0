"""`forge run --input` over a folder of shards, a glob and a pipe, through the CLI on the embedded
tiny-llama node (the real transformers engine): every record once, keyed by its global index; a
resume after a real SIGINT is exact; a changed shard set and a resumed pipe run are refused in one
line."""
import gzip
import json
import signal
import subprocess
import time

import pytest

from tests.reliability._rel import (
    REPO,
    assert_complete,
    assert_no_traceback,
    env,
    forge,
    kill9,
    run_argv,
    start,
)

LOCAL = REPO / "node_descriptions" / "local.yaml"
HOLD = REPO / "tests" / "e2e" / "fixtures" / "hold.py"


def _lines(ids) -> str:
    return "".join(json.dumps({"id": i, "text": f"record {i}"}) + "\n" for i in ids)


def _shards(root):
    """ids 0..23 over a gzip'd JSONL, a Parquet file and a JSONL in a sub-folder, in path order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "sub").mkdir(parents=True)
    with gzip.open(root / "a.jsonl.gz", "wt") as f:
        f.write(_lines(range(0, 10)))
    pq.write_table(
        pa.table({"id": list(range(10, 16)), "text": [f"record {i}" for i in range(10, 16)]}),
        root / "b.parquet",
    )
    (root / "sub" / "c.jsonl").write_text(_lines(range(16, 24)))
    (root / "_SUCCESS").write_text("")
    return root


def _check_ids(out):
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # global index = position in path order
    assert all(r["result"]["id"] == r["index"] for r in rows), rows[:3]


@pytest.mark.timeout(400)
def test_a_folder_of_shards_resumes_exactly_after_sigint(tmp_path):
    data = _shards(tmp_path / "data")
    out, err = tmp_path / "out.jsonl", tmp_path / "run.err"
    argv = run_argv(HOLD, data, out, LOCAL, "--concurrency", 4)
    proc = start(argv, stderr_path=err, env_extra={"FORGE_TEST_HOLD_FROM": "12"})
    try:
        t0 = time.monotonic()  # records 0-11 finish; 12.. wait in flight
        while (
            not out.exists() or len(out.read_text().splitlines()) < 12
        ) and time.monotonic() - t0 < 180:
            assert proc.poll() is None, err.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        kill9(proc)
    text = err.read_text()
    assert rc == 130, text
    assert "--input " + str(data) + ": 3 shard(s), 24 records" in text
    assert len(out.read_text().splitlines()) == 12

    again = forge(*argv[3:], timeout=240)
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr and "12 of 24 records already settled" in again.stderr
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 24)
    _check_ids(out)

    (data / "sub" / "d.jsonl").write_text(_lines([24]))     # a shard more: another input
    changed = forge(*argv[3:], timeout=240)
    assert changed.returncode == 1
    assert (
        "this ledger belongs to another run" in changed.stderr
        and "input_shards was 3, now 4" in changed.stderr
    )
    assert_no_traceback(changed.stderr)


@pytest.mark.timeout(300)
def test_a_glob_and_a_pipe(tmp_path):
    data = _shards(tmp_path / "data")
    out = tmp_path / "glob.jsonl"
    r = forge(
        "run",
        REPO / "functions" / "summarize.py",
        "--node",
        LOCAL,
        "--input",
        f"{data}/*.jsonl.gz",
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(line)["index"] for line in out.read_text().splitlines()) == list(
        range(10)
    )

    # `--input <(zcat a.jsonl.gz)` as bash runs it: the pipe's read end as /dev/fd/N
    piped = tmp_path / "pipe.jsonl"
    cmd = (f"{' '.join(map(str, run_argv(HOLD, '/dev/fd/3', piped, LOCAL)))} 3< <(zcat "
           f"{data}/a.jsonl.gz)")
    p = subprocess.run(
        ["bash", "-c", cmd], cwd=REPO, env=env(), capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr
    assert "is a pipe: read once as it comes, so this run cannot resume" in p.stderr
    assert sorted(json.loads(line)["index"] for line in piped.read_text().splitlines()) == list(
        range(10)
    )
    _check_ids(piped)

    p = subprocess.run(
        ["bash", "-c", cmd], cwd=REPO, env=env(), capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 1
    assert "a run from a pipe cannot resume" in p.stderr and "pass --restart" in p.stderr
    assert_no_traceback(p.stderr)
    p = subprocess.run(["bash", "-c", cmd.replace(" 3<", " --restart 3<")], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    assert len(piped.read_text().splitlines()) == 10
