"""A report's files: where they go, what format they declare, and how they are written (the JSON
data and the Markdown page made from it, each replaced atomically; PNGs at one resolution). `forge
run`'s report (report.py, plots.py) and `forge bench`'s reports (the forge-bench package) write
through here."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from forge.atomic import replace_text

REPORT_FORMAT = "forge-run-report"
REPORT_VERSION = 1
DIR_REPORT_NAME = "forge"          # a run directory gets forge.report.json / forge.report.md
DPI = 110                          # every report's PNGs


def report_paths(target: str | os.PathLike) -> tuple[Path, Path]:
    """Where the report of an output file (or a run directory) lives: (json, markdown)."""
    target = Path(target)
    base = target / DIR_REPORT_NAME if target.is_dir() else target
    return Path(f"{base}.report.json"), Path(f"{base}.report.md")


def write_json_and_markdown(
    json_path: Path, data: Any, md_path: Path, markdown: str, *, indent: int
) -> list[Path]:
    """The data as JSON (values JSON lacks written as their str), then the Markdown page made from
    it."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    replace_text(json_path, json.dumps(data, indent=indent, default=str) + "\n")
    replace_text(md_path, markdown)
    return [json_path, md_path]


def is_png(path: Path) -> bool:
    """Whether a file is a PNG (what a report may write over: forge never replaces a file it did not
    write)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False
