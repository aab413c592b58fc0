"""A damaged or lost ledger (issue 13, item 7): the real `forge run` names the file and says what to
do; when the output is complete it rebuilds the ledger from it, generating nothing again (an
invocation log proves it), and keeps the damaged file. Never `internal error`."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from forge import constants
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    forge,
    read_rows,
    record_figures,
    run_argv,
    write_echo_input,
)

N = 3000


def _run(inp, out, *extra, log: Path | None = None):
    env = {"FORGE_TEST_INVOCATIONS": str(log), "FORGE_TEST_RUN_ID": "rerun"} if log else None
    return forge(
        *run_argv(ECHO, inp, out, NODES / "instant.yaml")[3:], *extra, timeout=180, env_extra=env
    )


@pytest.fixture(scope="module")
def finished_once(tmp_path_factory):
    """One finished job (input, output, ledger), run once for the module; each test damages a copy
    of its own."""
    tmp = tmp_path_factory.mktemp("finished")
    inp = write_echo_input(tmp / "in.jsonl", N, bad_every=500)
    # 3 (error rows); 0 before exit codes said so
    assert _run(inp, tmp / "out.jsonl").returncode in (0, 3)
    return tmp


@pytest.fixture
def finished(finished_once, tmp_path):
    # in.jsonl, out.jsonl and its ledger (a finished run left no -wal)
    for p in finished_once.iterdir():
        shutil.copy2(p, tmp_path / p.name)
    return tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"


def _damage(ledger: Path, how: str, seed: int) -> None:
    data = bytearray(ledger.read_bytes())
    rng = random.Random(seed)
    if how == "flip":  # bytes flipped all over the B-tree pages (the case)
        for _ in range(64):
            data[rng.randrange(100, len(data))] ^= 0xFF
    elif how == "zero-page":                  # a page lost to a bad sector
        page = rng.randrange(1, len(data) // 4096)
        data[page * 4096:(page + 1) * 4096] = bytes(4096)
    elif how == "truncate":                   # a torn copy
        del data[len(data) // 2:]
    ledger.write_bytes(bytes(data))


def _one_line(r) -> str:
    assert_no_traceback(r.stderr)
    return r.stderr


@pytest.mark.parametrize(
    "how, seed", [("flip", 1), ("flip", 2), ("flip", 3), ("zero-page", 4), ("truncate", 5)]
)
def test_a_damaged_ledger_beside_a_complete_output_is_rebuilt_from_it(finished, how, seed):
    inp, out, ledger = finished
    _damage(ledger, how, seed)
    before = out.read_bytes()
    log = out.parent / "invocations.log"
    r = _run(inp, out, log=log)
    text = _one_line(r)
    assert r.returncode == constants.EXIT_ERROR_ROWS, text
    assert f"{ledger.name} was damaged (" in text and "rebuilt it from the 3,000 rows" in text, text
    assert out.read_bytes() == before  # the output is not touched
    assert log.read_text() == ""  # nothing generated again (echo logs each call)
    kept = [
        p
        for p in out.parent.iterdir()
        if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))
    ]
    assert len(kept) == 1                                  # the damaged file is kept, not deleted
    assert_complete(out, ledger, N)
    r2 = _run(inp, out)  # and the rebuilt ledger resumes like any other
    assert (
        r2.returncode == constants.EXIT_ERROR_ROWS
        and "is already complete: all 3,000 records are in it" in r2.stderr
    )
    record_figures(
        f"ledger-damaged-{how}",
        records=N,
        exit_code=r.returncode,
        rebuilt=True,
        generated_again=0,
        message=text.strip().splitlines()[0].split(" (")[0],
    )


def test_a_damaged_ledger_beside_an_incomplete_output_says_what_to_do(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"
    r = _run(inp, out, "--max-errors", "0")  # stops at the first failure (id 13): incomplete
    assert r.returncode == constants.EXIT_INCOMPLETE, r.stderr
    _damage(ledger, "flip", 7)
    before = out.read_bytes()
    r = _run(inp, out)
    lines = _one_line(r).strip().splitlines()
    assert r.returncode == constants.EXIT_FAILED and len(lines) == 1, r.stderr
    assert (
        f"{ledger.name}: the ledger is damaged (" in lines[0]
        and "cannot be rebuilt from it" in lines[0]
        and "restore" in lines[0]
        and "--restart" in lines[0]
    ), lines
    assert out.read_bytes() == before
    r = _run(inp, out, "--restart")  # the way out it names: the damaged file is set aside
    assert r.returncode == constants.EXIT_ERROR_ROWS and "--restart starts over" in r.stderr, (
        r.stderr
    )
    assert_complete(out, ledger, N)
    assert any(".damaged-" in p.name for p in tmp_path.iterdir())


def test_a_lost_ledger_beside_a_complete_output_is_rebuilt_and_nothing_regenerated(finished):
    inp, out, ledger = finished
    errors = sum("error" in row for row in read_rows(out))
    for p in out.parent.glob("out.jsonl.ledger.sqlite*"):
        p.unlink()
    log = out.parent / "invocations.log"
    r = _run(inp, out, log=log)
    assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
    assert f"{ledger.name} was missing: rebuilt it from the 3,000 rows" in r.stderr
    # error rows known from the output
    assert f"all 3,000 records are in it ({errors} of them error rows)" in r.stderr
    assert log.read_text() == ""
    assert_complete(out, ledger, N)


def test_a_lost_ledger_beside_an_incomplete_output_is_refused(tmp_path):
    inp = write_echo_input(tmp_path / "in.jsonl", N)
    out, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"
    assert _run(inp, out, "--max-errors", "0").returncode == constants.EXIT_INCOMPLETE
    for p in tmp_path.glob("out.jsonl.ledger.sqlite*"):
        p.unlink()
    before = out.read_bytes()
    r = _run(inp, out)
    assert r.returncode == constants.EXIT_FAILED, r.stderr
    assert "too few to rebuild the ledger from: pass --restart" in r.stderr
    assert out.read_bytes() == before and not ledger.exists()


def test_a_lost_ledger_of_a_finished_parquet_output_is_rebuilt_from_it(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    inp = write_echo_input(tmp_path / "in.jsonl", 500)
    out = tmp_path / "out.parquet"
    assert _run(inp, out).returncode == constants.EXIT_ERROR_ROWS
    before = out.read_bytes()
    for p in tmp_path.glob("out.parquet.ledger.sqlite*"):
        p.unlink()
    log = tmp_path / "invocations.log"
    r = _run(inp, out, log=log)
    assert (
        r.returncode == constants.EXIT_ERROR_ROWS
        and "was missing: rebuilt it from the 500 rows" in r.stderr
    ), r.stderr
    assert out.read_bytes() == before and log.read_text() == ""
    assert sorted(pq.read_table(out).column("index").to_pylist()) == list(range(500))


@pytest.mark.parametrize("seed", range(20))
def test_random_damage_never_ends_in_an_internal_error(finished, seed):
    """Wherever the bytes flip: the ledger is rebuilt (exit 3) or nothing is noticed (the flips hit
    free space or data the run does not read: exit 3 too); a refusal is one line naming the ledger.
    Never a traceback."""
    inp, out, ledger = finished
    data = bytearray(ledger.read_bytes())
    rng = random.Random(100 + seed)
    start = rng.randrange(0, len(data))
    for _ in range(rng.choice([1, 8, 64])):
        data[min(len(data) - 1, start + rng.randrange(0, 8192))] ^= rng.randrange(1, 256)
    ledger.write_bytes(bytes(data))
    r = _run(inp, out)
    assert_no_traceback(r.stderr)
    if r.returncode == constants.EXIT_FAILED:
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and ledger.name in lines[0], r.stderr
    else:
        assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
        rows = read_rows(out)
        assert sorted(row["index"] for row in rows) == list(range(N))
    record_figures(
        "ledger-random-damage",
        seed=seed,
        exit_code=r.returncode,
        rebuilt="rebuilt it" in r.stderr,
        refused=r.returncode == constants.EXIT_FAILED,
    )
