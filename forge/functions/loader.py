"""Load `FILE.py[:name]` as a forge function. Function files are trusted user code: they run as
you."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from forge.errors import UsageError, ForgeError
from forge.functions.api import FunctionSpec, spec_of


def parse_target(target: str) -> tuple[Path, str | None]:
    path, _, name = target.partition(":")
    if not path.endswith(".py"):
        raise UsageError(f"{target}: expected FILE.py or FILE.py:name")
    return Path(path), (name or None)


def load_function(target: str) -> FunctionSpec:
    """The function's spec (the ledger hashes the function's file itself:
    forge/ledger/resume.py)."""
    path, name = parse_target(target)
    if not path.is_file():
        raise ForgeError(f"{path}: no such function file")
    mod_name = f"forge_user_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ForgeError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # user code (even sys.exit at import): report where, not a traceback
        tb = e.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        where = f"{path}:{line}" if line else str(path)
        raise ForgeError(f"{where}: importing the function file failed: {type(e).__name__}: "
                         f"{_one_line(e)}") from e
    found = {s.name: s for s in (spec_of(v) for v in vars(module).values()) if s is not None}
    if name is not None:
        if name not in found:
            known = ", ".join(sorted(found)) or "none"
            raise ForgeError(f"{path}: no @forge.function named {name!r} (found: {known})")
        chosen = found[name]
    elif len(found) == 1:
        chosen = next(iter(found.values()))
    elif not found:
        raise ForgeError(f"{path}: no @forge.function in this file")
    else:
        raise ForgeError(f"{path}: several functions ({', '.join(sorted(found))}); name one as "
                         f"{path}:NAME")
    return chosen


def _one_line(e: BaseException) -> str:
    """An exception's message as one bounded line (it may span lines, be huge, or fail to print)."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a broken __str__ is the user's; say so instead
        text = f"<{type(e).__name__} whose message cannot be printed>"
    text = " ".join(text.split())
    return text if len(text) <= 500 else text[:500] + " ..."
