"""A poison result (issue 29, row 5) becomes that record's error row, never a run that cannot
finish: a result over the output row limit (it was stored whole in the ledger: past SQLite's limit
the commit failed, the run stopped as if the disk were full, and every rerun failed the same way
with the batch's other finished results never written), and results whose encoding raises what no
JSON encoder documents. Real `forge run` on the instant node."""
from __future__ import annotations

import json

from forge import constants
from tests.reliability._rel import (
    assert_complete,
    assert_no_traceback,
    forge,
    read_rows,
    record_figures,
    run_argv,
)

N = 20
# (the name the limit was given with the fix)
LIMIT = getattr(constants, "MAX_OUTPUT_ROW_BYTES", 64 << 20)
POISON = f'''
import forge

class Weird(dict):
    def items(self):
        raise ArithmeticError("no items today")

class Disk(dict):
    def items(self):
        raise OSError(28, "No space left on device")     # not the output's disk: the result's own encoding

@forge.function(max_output_tokens=8)
async def poison(record: dict, llm: forge.LLM):
    i = record["id"]
    if i == 3:
        return "x" * ({LIMIT} + 1)       # one byte over the limit
    if i == 5:
        return Weird(a=1)
    if i == 7:
        return [Disk(b=2)]
    out = await llm.generate(f"Say {{i}}", max_tokens=2)
    return {{"id": i, "text": out.text}}
'''


def test_a_poison_result_is_its_records_error_row_and_the_others_are_written(tmp_path):
    fn = tmp_path / "poison.py"
    fn.write_text(POISON)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(N)))
    out = tmp_path / "out.jsonl"
    r = forge(*run_argv(fn, inp, out)[3:], "--concurrency", "4", timeout=300)
    assert_no_traceback(r.stderr)
    assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
    rows = {row["index"]: row for row in read_rows(out)}
    assert set(rows) == set(range(N))
    errors = {i: row["error"] for i, row in rows.items() if "error" in row}
    assert set(errors) == {3, 5, 7}, errors
    assert errors[3]["type"] == "ResultTooLarge" and "limit" in errors[3]["message"]
    assert errors[5]["type"] == errors[7]["type"] == "SerializationError"
    assert all(rows[i]["result"]["id"] == i for i in set(range(N)) - {3, 5, 7})
    s = assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", N)
    r = forge(*run_argv(fn, inp, out)[3:], timeout=120)
    assert r.returncode == 3 and "already complete" in r.stderr, r.stderr
    record_figures("poison-result", records=N, error_rows=s["errors"], limit_bytes=LIMIT,
                   message=errors[3]["message"])
