"""`--max-errors P%` is checked whenever the counts change, not only when a record fails (issue 29, row 13): with
every record started at once, the failures (which return at once) all settle before the minimum sample has, and
a check made only on a failure never came. Real `forge run` subprocesses on an instant engine held to ~70
records/s, so the successes settle over seconds."""
from __future__ import annotations

from forge import constants
from tests.reliability._rel import NODES, assert_complete, assert_no_traceback, forge, read_rows, run_argv

EVERY_TENTH_FAILS = '''
import forge

@forge.function(max_output_tokens=8)
async def tenth(record: dict, llm: forge.LLM) -> dict:
    if record["id"] % 10 == 0:                       # fails at once, before any generation
        raise ValueError("every tenth record is broken")
    await llm.generate(f"Say {record['id']}", max_tokens=2)
    return {"id": record["id"]}
'''


def _write_input(path, n):
    path.write_text("".join(f'{{"id": {i}}}\n' for i in range(n)))
    return path


def test_a_share_is_checked_when_the_sample_fills_even_after_the_last_failure(tmp_path):
    fn = tmp_path / "tenth.py"
    fn.write_text(EVERY_TENTH_FAILS)
    inp = _write_input(tmp_path / "in.jsonl", 600)
    out = tmp_path / "out.jsonl"
    # default concurrency (1024): all 600 start at once; the 60 failures settle first, then the successes
    r = forge(*run_argv(fn, inp, out, NODES / "slow.yaml")[3:], "--max-errors", "5%", timeout=300)
    assert_no_traceback(r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == constants.EXIT_INCOMPLETE, r.stderr
    assert "more than --max-errors 5%" in last and "run the same command again" in last, last
    rows = read_rows(out)
    assert len(rows) < 600 and sum("error" in row for row in rows) == 60, len(rows)
    r = forge(*run_argv(fn, inp, out, NODES / "slow.yaml")[3:], timeout=300)   # no limit: the rerun completes
    assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 600)
