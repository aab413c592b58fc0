"""`forge run` / `forge deploy` take FILE.py with --input, or --openai-batch alone: any other mix is
a usage error (exit 2, one line), answered before any file is read or node loaded (the real CLI
entry, in process)."""
from __future__ import annotations

import sys

import pytest

from forge.cli import main
from forge.constants import EXIT_USAGE


@pytest.mark.parametrize("argv, message", [
    (["run", "--openai-batch", "b.jsonl", "f.py", "--output", "o.jsonl"],
     "forge: --openai-batch is the job's input and its function: give no FILE.py and no --input"),
    (["deploy", "--openai-batch", "b.jsonl", "--input", "i.jsonl", "--output", "o.jsonl"],
     "forge: --openai-batch is the job's input and its function: give no FILE.py and no --input"),
    (["run", "--output", "o.jsonl"], "forge: missing argument FILE.py[:NAME] (or give "
                                     "--openai-batch BATCH.jsonl)"),
    (["run", "f.py", "--output", "o.jsonl"], "forge: missing option --input (the records FILE.py "
                                             "runs over)"),
    (["deploy", "--openai-batch", "b.jsonl", "--output", "o.jsonl", "--cluster", "auto"],
     "forge: --openai-batch runs on one node (forge run, or forge deploy --node), not --cluster"),
])
def test_the_job_is_a_function_over_records_or_an_openai_batch_file(
    argv, message, monkeypatch, capsys, tmp_path
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["forge", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == EXIT_USAGE
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []          # nothing written
