"""What forge may write over: never the input, never a file it did not write.

Every file a job writes (the output or its Parquet staging file, the ledger, the reports) is checked
here before anything is opened for writing. Files are compared by device and inode, so a hard link
or a symlink to the input is caught as the input itself."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Optional

from forge.errors import ForgeError, display_path

_READ_BYTES = 1 << 20
_ROW_START = b'{"index": '


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Both exist and are one file (links followed)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def refuse_overlaps(named: dict[str, Optional[Path]]) -> None:
    """`named`: what each path is (`--input`, `--output`, `the ledger` ...). Two roles on one file
    are refused: writing the output or the ledger onto the input (or onto each other) destroys
    it."""
    items = [(role, Path(p)) for role, p in named.items() if p is not None]
    for i, (role_a, a) in enumerate(items):
        for role_b, b in items[i + 1:]:
            one_path = os.path.abspath(a) == os.path.abspath(b)
            if one_path or same_file(a, b):
                # Named as given: display_path would resolve the very link this message is about.
                how = "" if one_path else f" {a} (through a link)"
                raise ForgeError(f"{b}: {role_b} is the same file as {role_a}{how}; forge would "
                                 "overwrite it: "
                                 f"choose another {_flag(role_b)}")


def _flag(role: str) -> str:
    return {
        "--output": "--output",
        "the ledger": "--ledger",
        "the Parquet staging file": "--output",
        "the report": "--output (or pass --no-report)",
        "the Markdown report": "--output (or pass --no-report)",
    }.get(role, "path")


def require_regular_or_absent(path: Path, what: str) -> None:
    """A FIFO, a device or a folder is never an output: opening it for writing may block or destroy
    it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ForgeError(f"{display_path(path)}: cannot use it as {what}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ForgeError(f"{display_path(path)}: {what} exists and is not a regular file; "
                         "forge never writes over a file it did not write: choose another path")


def refuse_foreign(path: Path, why: str) -> ForgeError:
    return ForgeError(f"{display_path(path)}: exists and is not forge output ({why}); forge never "
                      "writes over "
                      "a file it did not write (not even with --restart): move it away or choose "
                      "another --output")


def is_torn_tail(f, start: int) -> bool:
    """Is everything from byte `start` on what a killed forge run can leave after its last complete
    row? That is: one row cut short (no newline, starting like a forge row), possibly with zero
    bytes where a power loss left unwritten blocks. Another file's lines (the input, a text file)
    never pass."""
    f.seek(start)
    head, newlines, last, zeros = b"", 0, b"", False
    while chunk := f.read(_READ_BYTES):
        data = chunk.replace(b"\x00", b"")
        zeros = zeros or len(data) < len(chunk)
        if not data:
            continue
        if len(head) < len(_ROW_START):
            head += data[: len(_ROW_START) - len(head)]
        newlines += data.count(b"\n")
        last = data[-1:]
    # A row cut short has no newline; one that ends in a newline is whole unless a power loss zeroed
    # part of it.
    if newlines > 1 or (newlines == 1 and (last != b"\n" or not zeros)):
        return False
    head = head.rstrip(b"\n")
    return head.startswith(_ROW_START) or _ROW_START.startswith(head)



def parquet_is_forge_output(path: Path) -> bool:
    """A Parquet file with forge's columns (index, result or result_json, error_type,
    error_message)."""
    try:
        import pyarrow.parquet as pq

        # a file object: pyarrow cannot take a path that is not UTF-8
        with open(path, "rb") as source:
            names = set(pq.read_schema(source).names)
    except Exception:  # noqa: BLE001 - not readable as Parquet: not ours
        return False
    return names in ({"index", "result", "error_type", "error_message"},
                     {"index", "result_json", "error_type", "error_message"})


def report_overwrite_problem(path: Path, *, kind: str) -> Optional[str]:
    """Why writing a report at `path` would destroy a file forge did not write (None when it may).
    kind: "json" (a forge run report: `format` says so) or "md" (starts with forge's heading)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{display_path(path)}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{display_path(path)} exists and is not a regular file"
    try:
        with open(path, "rb") as f:
            head = f.read(_READ_BYTES)
    except OSError as e:
        return f"{display_path(path)}: {e.strerror}"
    if not head:
        return None
    if kind == "json":   # written with the format first: {"format": "forge-run-report", ...
        ok = re.match(rb'\{\s*"format":\s*"forge-run-report"', head) is not None
    else:
        ok = head.startswith(b"# forge run report")
    return None if ok else f"{display_path(path)} exists and is not a forge report"
