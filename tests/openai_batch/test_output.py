"""The OpenAI output is made in input order from the job's rows (which land in completion order),
once every line has its row; a forge error row becomes the failed-request row vLLM writes."""
from __future__ import annotations

import json

import pytest

from forge.errors import ForgeError
from forge.openai_batch.answer import ok_row
from forge.openai_batch.output import rows_path, write_in_input_order


def setup(tmp_path, n):
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"id-{i}",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"model": "m", "prompt": str(i)},
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    out = tmp_path / "out.jsonl"
    return batch, out, rows_path(out)


def test_rows_in_completion_order_come_out_in_input_order(tmp_path):
    batch, out, rows = setup(tmp_path, 5)
    order = [3, 0, 4, 1, 2]
    lines = []
    for i in order:
        if i == 4:  # a line whose function failed outside its request (an engine error)
            lines.append(
                json.dumps(
                    {"index": i, "error": {"type": "ForgeError", "message": "card cpu0 failed"}}
                )
            )
        else:
            lines.append(json.dumps({"index": i, "result": ok_row(f"id-{i}", {"text": str(i)})}))
    rows.write_text("\n".join(lines) + "\n")
    assert write_in_input_order(batch, rows, out) == (5, 1)
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in got] == [f"id-{i}" for i in range(5)]
    assert [r["response"]["body"] for r in got if r["error"] is None] == [
        {"text": str(i)} for i in (0, 1, 2, 3)
    ]
    failed = got[4]
    assert set(failed) == {"id", "custom_id", "response", "error"}
    assert failed["response"]["status_code"] == 500 and failed["response"]["body"] is None
    assert failed["error"]["error"]["message"] == "ForgeError: card cpu0 failed"


def test_a_line_without_a_row_writes_nothing(tmp_path):
    batch, out, rows = setup(tmp_path, 3)
    rows.write_text(
        "".join(json.dumps({"index": i, "result": ok_row(f"id-{i}", {})}) + "\n" for i in (0, 2))
    )
    with pytest.raises(ForgeError, match="1 of 3 batch lines have no row yet \\(first: line 2\\)"):
        write_in_input_order(batch, rows, out)
    assert not out.exists()
