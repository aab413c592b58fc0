"""Byte sizes as users write them: 0, 1048576, "8GiB", "512 MB"."""
from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_RX = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)

GIB = 2**30


def parse_bytes(value: int | str) -> int:
    """Bytes from an int or a size string; raises ValueError naming the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '8GiB'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    m = _RX.match(value)
    if not m:
        raise ValueError(f"not a size: {value!r} (use bytes, or e.g. '512MiB', '8GiB')")
    size = float(m.group(1)) * _UNITS[(m.group(2) or "").upper()]
    if size == float("inf"):            # more digits than a float holds: no machine has that much
        raise ValueError(f"size too large: {value[:40]!r}")
    return int(size)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            try:
                return f"{n / size:.2f} {unit}"
            # beyond floats (a description may say anything): order of magnitude
            except OverflowError:
                return f"about 10^{len(str(abs(int(n)) // size)) - 1} {unit}"
    return f"{int(n)} B"
