"""The output stays the output (issue 48, "Data loss" and "Stuck"; issue 50 item 5). Real `forge
run` subprocesses on the instant node (paced where a run must last long enough to be hit mid-run):

- the output deleted (`rm`) or emptied (`: >`) mid-run: exit 4 and one line; the rerun makes again
  only the rows the output lost, and every index is in the output exactly once;
- a shard, the output or an exception message whose text is not UTF-8, with a Parquet output: the
  `.parquet` is written and every row is strict JSON text; the report of a non-UTF-8 output name is
  written and said to be;
- the run's own report in the input folder is never read as a shard (and the run says it left it
  out);
- a single `.jsonl.gz` input takes an output beside it."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from forge.constants import EXIT_ERROR_ROWS, EXIT_INCOMPLETE, EXIT_OK
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    forge,
    record_figures,
    resume_report,
    run_argv,
    start,
    wait_for_growth,
    write_echo_input,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
N = 3000            # ~2 s of the paced engine: the output is hit while rows are still going in


def _lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


@pytest.mark.parametrize("how", ["rm", "truncate"])
def test_an_output_deleted_or_emptied_mid_run_stops_and_the_rerun_completes_it(tmp_path, how):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"
    proc = start(run_argv(ECHO, inp, out, NODES / "paced.yaml"), stderr_path=tmp_path / "run.err")
    try:
        assert wait_for_growth(out, proc, beyond=20_000, timeout_s=60), (
            tmp_path / "run.err"
        ).read_text()
        if how == "rm":
            out.unlink()  # rm out.jsonl: the exit 0, "2000 done", no file
        else:
            # : > out.jsonl: the exit 0 with 1,872 of 2,000 rows
            with open(out, "r+b") as f:
                f.truncate(0)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "run.err").read_text()
    assert_no_traceback(err)
    assert rc == EXIT_INCOMPLETE, err
    last = _lines(err)[-1]
    want = "was deleted during the run" if how == "rm" else "was cut short during the run"
    assert (
        last.startswith(f"forge: stopped: {out}: {want}") and "run the same command again" in last
    ), err
    rows_left = out.read_bytes().count(b"\n") if out.exists() else 0
    assert rows_left < N
    rerun = forge(*run_argv(ECHO, inp, out, NODES / "paced.yaml")[3:], timeout=180)
    assert rerun.returncode == EXIT_ERROR_ROWS, rerun.stderr        # echo fails every id % 97 == 13
    assert_no_traceback(rerun.stderr)
    assert f"an earlier start stopped because it {want}" in rerun.stderr, rerun.stderr
    summary = assert_complete(out, ledger, N)  # every index exactly once, the ledger agrees
    again = forge(*run_argv(ECHO, inp, out, NODES / "paced.yaml")[3:], timeout=120)
    assert again.returncode == EXIT_ERROR_ROWS and "already complete" in again.stderr, again.stderr
    record_figures(
        f"output-{how}-mid-run",
        records=N,
        exit_code=rc,
        message=last,
        rows_left=rows_left,
        rerun=resume_report(rerun.stderr),
        retried=summary["retried"],
    )


UNLUCKY = '''
import forge

@forge.function(max_output_tokens=4)
async def unlucky(record: dict, llm: forge.LLM) -> dict:
    if record["id"] == 2:
        raise ValueError("cannot read " + b"caf\\xe9 \\xff".decode("utf-8", "surrogateescape"))
    out = await llm.generate("Say: " + str(record["id"]), max_tokens=4)
    return {"id": record["id"], "tokens": out.output_tokens}
'''


@pytest.mark.parametrize("output", ["out.parquet", b"r\xe9sults\xff.parquet", "out.jsonl"])
def test_text_that_is_not_utf8_never_blocks_an_output(tmp_path, output):
    """A shard whose name is not UTF-8 (with a bad line: its error row names the file), an exception
    message holding a lone surrogate, an output name that is not UTF-8: the run completes (exit 3),
    the Parquet file is written, every row is valid text, and the report is written and said to
    be."""
    pq = pytest.importorskip("pyarrow.parquet")
    fn = tmp_path / "unlucky.py"
    fn.write_text(UNLUCKY)
    folder = tmp_path / "in"
    folder.mkdir()
    with open(os.path.join(os.fsencode(folder), b"part\xff.jsonl"), "w") as f:
        f.write("".join(json.dumps({"id": i}) + "\n" for i in range(4)) + "{not json\n")
    out = os.path.join(
        os.fsencode(tmp_path), output if isinstance(output, bytes) else output.encode()
    )
    r = forge(
        "run",
        fn,
        "--node",
        NODES / "instant.yaml",
        "--input",
        folder,
        "--output",
        os.fsdecode(out),
        "--progress",
        "off",
        timeout=180,
    )
    assert r.returncode == EXIT_ERROR_ROWS, r.stderr
    assert_no_traceback(r.stderr)
    assert "no report written" not in r.stderr and "forge: report " in r.stderr, r.stderr
    for suffix in (b".report.json", b".report.md"):
        assert os.path.exists(out + suffix), suffix
        with open(out + suffix, "rb") as f:
            f.read().decode("utf-8")                                      # valid UTF-8
    if out.endswith(b".parquet"):
        with open(out, "rb") as f:
            rows = pq.read_table(f).to_pylist()
        errors = {row["index"]: row["error_message"] for row in rows if row["error_type"]}
    else:
        with open(out, "rb") as f:
            rows = [json.loads(line.decode("utf-8")) for line in f]
        errors = {row["index"]: row["error"]["message"] for row in rows if "error" in row}
    assert len(rows) == 5
    # escaped as text, strict UTF-8
    assert errors[2].startswith("cannot read caf\\udce9 \\udcff (at ")
    # the shard's name, escaped as text
    assert "in/part\\udcff.jsonl:5: not valid JSON" in errors[4]
    for message in errors.values():
        message.encode("utf-8")
    again = forge(
        "run",
        fn,
        "--node",
        NODES / "instant.yaml",
        "--input",
        folder,
        "--output",
        os.fsdecode(out),
        "--progress",
        "off",
        timeout=120,
    )
    assert again.returncode == EXIT_ERROR_ROWS and "already complete" in again.stderr, again.stderr


def test_the_run_report_in_the_input_folder_is_never_a_shard(tmp_path):
    """`--input data --output data/results`: the report lands in the folder; the rerun leaves it
    out, says so, and finds the run complete (it was refused as another run's ledger: "input_shards
    was 2, now 3")."""
    data = tmp_path / "data"
    data.mkdir()
    write_echo_input(data / "a.jsonl", 5)
    write_echo_input(data / "b.jsonl", 5)
    argv = [
        "run",
        ECHO,
        "--node",
        NODES / "instant.yaml",
        "--input",
        data,
        "--output",
        data / "results",
        "--progress",
        "off",
    ]
    first = forge(*argv, timeout=120)
    assert first.returncode == EXIT_OK, first.stderr
    assert (data / "results.report.json").exists()
    rerun = forge(*argv, timeout=120)
    assert rerun.returncode == EXIT_OK, rerun.stderr
    assert_no_traceback(rerun.stderr)
    assert (f"left out {data / 'results.report.json'} (forge's run report): forge never reads its "
            "own files as input"
            in " ".join(rerun.stderr.split())), rerun.stderr
    assert "2 shard(s), 10 records" in rerun.stderr and "already complete" in rerun.stderr, (
        rerun.stderr
    )


def test_a_single_gz_input_takes_an_output_in_its_own_folder(tmp_path):
    """Issue 50 item 5: refused before with "--output lies among the input shards"; the same layout
    as .jsonl ran."""
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(write_echo_input(tmp_path / "plain.jsonl", 6).read_bytes()))
    out = tmp_path / "out.jsonl"
    r = forge(*run_argv(ECHO, gz, out)[3:], timeout=120)
    assert r.returncode == EXIT_OK, r.stderr
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 6)
    same = forge(*run_argv(ECHO, gz, gz)[3:], timeout=120)
    assert same.returncode == 1 and _lines(same.stderr) == [
        f"forge: {gz}: --output is the input file --input {gz}; forge would overwrite it: choose "
        "another "
        "--output"], same.stderr


def test_a_truncated_zst_input_is_refused_in_one_line(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    data = write_echo_input(tmp_path / "plain.jsonl", 2000).read_bytes()
    z = tmp_path / "in.jsonl.zst"
    z.write_bytes(zstandard.ZstdCompressor().compress(data)[:-100])
    r = forge(*run_argv(ECHO, z, tmp_path / "out.jsonl")[3:], timeout=120)
    assert r.returncode == 1, r.stderr
    assert _lines(r.stderr) == [f"forge: {z}: cannot decompress (zstandard): the file ends inside "
                                "a zstandard "
                                "frame (it was cut short)"], r.stderr
    z.write_bytes(zstandard.ZstdCompressor().compress(data) + b"\x00garbage")
    r = forge(*run_argv(ECHO, z, tmp_path / "out.jsonl")[3:], timeout=120)
    assert r.returncode == 1 and len(_lines(r.stderr)) == 1 and "not zstandard data" in r.stderr, (
        r.stderr
    )
    assert not Path(tmp_path / "out.jsonl").exists()


def test_a_shard_deleted_after_it_was_read_leaves_a_complete_output_complete(tmp_path):
    """The issue's case: exit 4 and a refused rerun. The first shard is deleted while the run works
    on the second: every row was made from what was read, so the run is complete (exit 3: echo's
    error rows) and says what happened, and the rerun finds it complete. A shard added since is a
    changed input, refused as before."""
    data = tmp_path / "data"
    data.mkdir()
    write_echo_input(data / "a.jsonl", 10)
    with open(data / "b.jsonl", "w") as f:
        f.write("".join(json.dumps({"id": i, "text": f"record {i}"}) + "\n" for i in range(10, N)))
    out = tmp_path / "out.jsonl"
    proc = start(run_argv(ECHO, data, out, NODES / "paced.yaml"), stderr_path=tmp_path / "run.err")
    try:
        assert wait_for_growth(out, proc, beyond=20_000, timeout_s=60), (
            tmp_path / "run.err"
        ).read_text()
        (data / "a.jsonl").unlink()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "run.err").read_text()
    assert_no_traceback(err)
    assert rc == EXIT_ERROR_ROWS, err
    assert (
        "shard(s) a.jsonl deleted during the run, after they were read; the output holds their rows"
        in err
    ), err
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
    rerun = forge(*run_argv(ECHO, data, out, NODES / "paced.yaml")[3:], timeout=120)
    assert rerun.returncode == EXIT_ERROR_ROWS, rerun.stderr
    assert "shard(s) a.jsonl deleted since the run read them" in rerun.stderr, rerun.stderr
    assert f"is already complete: all {N:,} records are in it" in rerun.stderr, rerun.stderr
    write_echo_input(data / "c.jsonl", 1)
    added = forge(*run_argv(ECHO, data, out, NODES / "paced.yaml")[3:], timeout=120)
    assert added.returncode == 1 and "this ledger belongs to another run" in added.stderr, (
        added.stderr
    )
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
