"""Finding and reading user files: bounded in size and count, safe against symlink loops and
special files (a FIFO or /dev/zero would otherwise block or never end)."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from forge import constants

CONFIG_SUFFIXES = (".yaml", ".yml")
MAX_FILES_PER_WALK = 10_000      # a folder argument with more YAML files than this is refused


class FileRefused(Exception):
    """A file we will not read; the message is one line for the user."""


def _stat_reason(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "symlink loop"
    if e.errno == errno.ENOENT:
        return "no such file (or a dangling symlink)"
    if e.errno == errno.EACCES:
        return "permission denied"
    return e.strerror or type(e).__name__


def read_bytes(path: Path, limit: int = constants.MAX_CONFIG_FILE_BYTES) -> bytes:
    """The file's bytes, refusing non-regular files and anything over `limit` bytes."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise FileRefused(_stat_reason(e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused("not a regular file")
    if st.st_size > limit:
        raise FileRefused(f"file is {st.st_size} bytes; the limit is {limit} bytes")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)        # the file may have grown since stat
    except OSError as e:
        raise FileRefused(_stat_reason(e)) from None
    if len(data) > limit:
        raise FileRefused(f"file is larger than the limit of {limit} bytes")
    return data


def decode_text(data: bytes) -> str:
    """UTF-8 text (a BOM is allowed); binary content and other encodings are refused."""
    if b"\x00" in data:
        raise FileRefused("binary file (contains NUL bytes), not YAML text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise FileRefused(
            f"not UTF-8 text (invalid byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    return text


def walk_configs(root: Path) -> tuple[list[Path], list[tuple[Path, str, str]]]:
    """YAML files below `root`, sorted, hidden entries skipped, each real folder visited once.

    Returns (files, notes) where a note is (path, severity, message) for loops and unreadable
    entries."""
    files: list[Path] = []
    notes: list[tuple[Path, str, str]] = []
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
        except OSError as e:
            notes.append((folder, "error", _stat_reason(e)))
            continue
        ident = (st.st_dev, st.st_ino)
        if ident in seen:
            notes.append((folder, "warning", "symlink loop: this folder was already visited; "
                                             "skipped"))
            continue
        seen.add(ident)
        try:
            entries = sorted(os.scandir(folder), key=lambda d: d.name)
        except OSError as e:
            notes.append((folder, "error", f"cannot list folder: {_stat_reason(e)}"))
            continue
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError as e:
                if entry.name.endswith(CONFIG_SUFFIXES):
                    files.append(path)          # reading it reports why, under its own name
                else:
                    notes.append((path, "error", _stat_reason(e)))
                continue
            if is_dir:
                subfolders.append(path)
            elif entry.name.endswith(CONFIG_SUFFIXES):
                files.append(path)
                if len(files) > MAX_FILES_PER_WALK:
                    notes.append((root, "error", f"more than {MAX_FILES_PER_WALK} YAML files below "
                                                 "this folder"))
                    return files[:MAX_FILES_PER_WALK], notes
        stack.extend(reversed(subfolders))
    return files, notes


def read_json(path: Path, *, parse_int=None) -> dict:
    """A JSON object from a bounded file; FileRefused with a one-line reason otherwise. `parse_int`:
    json.loads's (a reader that names a field holding a 5,000-digit number passes one that keeps it
    apart instead of failing)."""
    import json

    text = decode_text(read_bytes(path))
    try:
        data = json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as e:
        raise FileRefused(f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise FileRefused("JSON nested too deeply") from None
    # an integer of more digits than Python converts (4,300): say so, no traceback
    except ValueError as e:
        raise FileRefused(f"not readable JSON: {' '.join(str(e).split())[:160]}") from None
    if not isinstance(data, dict):
        raise FileRefused("expected a JSON object at the top level")
    return data


def shown(path: Path) -> str:
    """A path as the user gave it: relative to the current folder when below it; symlinks not
    resolved (a problem in `up/x.yaml` must not be reported as the file the link points to)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path(os.path.abspath(os.getcwd()))))
    except ValueError:
        return str(absolute)
