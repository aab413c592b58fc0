"""An OpenAI batch file as a forge job: the file checked whole before any engine loads, the job run
as every forge job (ledger, resume, exactly once) into its own rows beside the output, then the
output written in input order once every line has its row."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Callable

from forge import constants
from forge.errors import ForgeError, display_path
from forge.functions.job import JobOptions, run_with_node
from forge.node.interface import Node
from forge.openai_batch.answer import BatchAnswerer, batch_function
from forge.openai_batch.lines import check_file, refuse_problems
from forge.openai_batch.output import rows_path, write_in_input_order
from forge.records.guard import refuse_overlaps, require_regular_or_absent


def _refuse_foreign_output(opts: JobOptions) -> None:
    """The output is replaced as a whole at the end: never a file an earlier batch run of this
    ledger did not write."""
    output = opts.output_path
    require_regular_or_absent(output, "--output")
    if output.suffix in (".parquet", ".pq"):
        raise ForgeError(f"{display_path(output)}: an OpenAI batch output is JSONL; name it .jsonl")
    if output.exists() and not opts.restart and not opts.ledger_path.exists():
        raise ForgeError(f"{display_path(output)}: a file is there that no batch run of this "
                         "ledger "
                         f"({display_path(opts.ledger_path)}) wrote; forge never writes over it: "
                         "choose another "
                         "--output, or pass --restart to replace it")


def run_openai_batch(
    make_node: Callable[[], Node], opts: JobOptions, *, node_label: str = ""
) -> int:
    """`opts.input_path` is the batch file, `opts.output_path` the OpenAI output. Returns the job's
    exit code."""
    batch, output = opts.input_path, opts.output_path
    rows = rows_path(output)
    refuse_overlaps({"--openai-batch": batch, "--output": output, "the job's rows": rows,
                     "the ledger": opts.ledger_path})
    _refuse_foreign_output(opts)
    checked = check_file(batch)
    refuse_problems(checked)
    print(f"forge: {display_path(batch)}: {checked.lines:,} batch lines checked (custom_ids "
          "unique, every body "
          f"accepted); rows go to {display_path(rows)}, the output is written in input order at "
          "the end",
          file=sys.stderr)
    # starting over: no output of the run discarded stays to be read
    if opts.restart and output.exists():
        output.unlink()
    answerer = BatchAnswerer(checked.models, display_path(batch))
    job = dataclasses.replace(opts, output_path=rows, function=batch_function(answerer))
    code = run_with_node(make_node, job, node_label=node_label)
    if code not in (constants.EXIT_OK, constants.EXIT_ERROR_ROWS):
        print(
            f"forge: {display_path(output)} is written once every batch line has its row",
            file=sys.stderr,
        )
        return code
    written, errors = write_in_input_order(batch, rows, output)
    print(f"forge: {display_path(output)}: {written:,} rows in input order, {errors:,} of them "
          "error rows",
          file=sys.stderr)
    return constants.EXIT_ERROR_ROWS if errors else constants.EXIT_OK


def batch_options(batch: Path, output: Path, ledger: Path, **common) -> JobOptions:
    return JobOptions(target="", input_path=batch, output_path=output, ledger_path=ledger, **common)
