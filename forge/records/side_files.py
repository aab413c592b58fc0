"""forge's own files beside an output: recognised by name (and, for the reports, by their first
bytes), so that `--input` as a folder or a glob never reads one of them as a shard.

`--input data --output data/results` puts `results.report.json` into the input folder; read as a
shard on the rerun, it would change the run's shard set (and be read as records). The ledger (and
its SQLite -wal/-shm), a Parquet run's staging JSONL and the reports are forge's alone: left out of
the input, and the run says so."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from forge.records.reader import PARQUET_SUFFIXES

# a report is written format first
REPORT_JSON_HEAD = re.compile(rb'\{\s*"format":\s*"forge-run-report"')
REPORT_MD_HEAD = b"# forge run report"
LEDGER_SUFFIXES = (".ledger.sqlite", ".ledger.sqlite-wal", ".ledger.sqlite-shm")
STAGING_SUFFIX = ".staging.jsonl"
_HEAD_BYTES = 64


def forge_side_file(path: Path) -> Optional[str]:
    """What forge file `path` is ("forge's run report", ...), or None when it is not one of forge's
    side files."""
    name = path.name.lower()
    if name.endswith(LEDGER_SUFFIXES):
        return "a forge ledger"
    if name.endswith(STAGING_SUFFIX) and name[: -len(STAGING_SUFFIX)].endswith(PARQUET_SUFFIXES):
        return "a Parquet run's staging file"
    if name.endswith(".report.json") and REPORT_JSON_HEAD.match(_head(path)):
        return "forge's run report"
    if name.endswith(".report.md") and _head(path).startswith(REPORT_MD_HEAD):
        return "forge's run report"
    return None


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError:
        return b""
