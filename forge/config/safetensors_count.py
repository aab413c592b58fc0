"""Parameters in a checkpoint's *.safetensors files, read from their headers only (never the
weights).

A safetensors file is an 8-byte little-endian header length, a JSON header {tensor name: {dtype,
shape, data_offsets}} (plus an optional __metadata__), then the data. Every part of a header is
checked before it is believed: a header that is not an object, an entry that is not a tensor, a
shape that is not a list of whole non-negative numbers, offsets outside the file, or a shape whose
size disagrees with its bytes is refused with the file and the JSON path
(`model.safetensors::$['lm_head.weight'].shape[0]: ...`). A file that is not a regular file (a FIFO,
a device, a folder) is refused without blocking on it."""
from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from forge.config.files import shown
from forge.config.messages import json_path
from forge.errors import ForgeError

MAX_HEADER_BYTES = 100 << 20        # the safetensors format's own limit
MAX_FILES = 10_000
MAX_DIMS = 16
DTYPE_BITS = {
    "F64": 64,
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "I64": 64,
    "I32": 32,
    "I16": 16,
    "I8": 8,
    "U64": 64,
    "U32": 32,
    "U16": 16,
    "U8": 8,
    "BOOL": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "C64": 64,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "F4": 4,
}


@dataclass(frozen=True)
class HeaderCount:
    parameters: int
    files: int
    label: str                      # "model.safetensors header" | "3 *.safetensors headers"


def count_safetensors(ckpt: Path) -> Optional[HeaderCount]:
    """The parameters the checkpoint's *.safetensors headers declare; None when it has no such
    file."""
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        return None
    if len(files) > MAX_FILES:
        raise ForgeError(f"{shown(ckpt)}: more than {MAX_FILES:,} *.safetensors files; forge reads "
                         "at most that many")
    total = sum(_count_file(f) for f in files)
    label = f"{files[0].name} header" if len(files) == 1 else f"{len(files)} *.safetensors headers"
    return HeaderCount(total, len(files), label)


def _refuse(file: Path, parts: tuple, message: str) -> ForgeError:
    return ForgeError(f"{shown(file)}::{json_path(parts)}: {message}")


def _count_file(file: Path) -> int:
    header, data_bytes = _read_header(file)
    if not isinstance(header, dict):
        raise _refuse(file, (), f"the header is a {_kind(header)}, not a JSON object of tensors")
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        total += _tensor_elements(file, (name[:120],), entry, data_bytes)
    return total


def _read_header(file: Path) -> tuple[object, int]:
    """The parsed header and the bytes of data after it. Opened non-blocking and checked to be a
    regular file before anything is read (open() of a FIFO without O_NONBLOCK waits for a writer
    forever)."""
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):
            raise _refuse(file, (), "not a regular file (a FIFO, a device or a folder); forge "
                                    "reads the header of a "
                          "safetensors file only")
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _refuse(file, (), f"cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for something else between the stat and the open
            raise _refuse(file, (), "not a regular file; forge reads the header of a safetensors "
                                    "file only")
        prefix = _read_exactly(fd, 8, file)
        length = int.from_bytes(prefix, "little")
        if length > min(MAX_HEADER_BYTES, st.st_size - 8):
            raise _refuse(file, (), f"declares a header of {length:,} bytes in a file of "
                                    f"{st.st_size:,} bytes "
                          f"(at most {MAX_HEADER_BYTES:,}): not a safetensors file, or a truncated "
                          "one")
        raw = _read_exactly(fd, length, file)
    except OSError as e:
        raise _refuse(file, (), f"cannot read: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        return json.loads(raw.decode("utf-8")), st.st_size - 8 - length
    except RecursionError:
        raise _refuse(file, (), "the header is JSON nested too deeply") from None
    except ValueError as e:  # not UTF-8, not JSON, or an integer of more digits than Python reads
        raise _refuse(
            file, (), f"the header is not readable JSON: {' '.join(str(e).split())[:160]}"
        ) from None


def _read_exactly(fd: int, n: int, file: Path) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise _refuse(file, (), f"ends before its {n:,}-byte header does: a truncated "
                                    "safetensors file")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _kind(value) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
    return f"a {_kind(value)}"


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_elements(file: Path, at: tuple, entry, data_bytes: int) -> int:
    """Elements of one tensor entry, after checking it against the bytes it claims in the file."""
    if not isinstance(entry, dict):
        raise _refuse(file, at, f"a {_kind(entry)}, not a tensor entry {{dtype, shape, "
                                f"data_offsets}}")
    shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise _refuse(file, at + ("shape",), f"a {_kind(shape)}, not a list of at most {MAX_DIMS} "
                                             "dimensions")
    for i, dim in enumerate(shape):
        if not _whole(dim):
            raise _refuse(file, at + ("shape", i), f"{_value(dim)} is not a whole non-negative "
                                                   "number")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_whole, offsets))
            and offsets[0] <= offsets[1] <= data_bytes):
        raise _refuse(file, at + ("data_offsets",), "not [begin, end] within the file's "
                                                    f"{data_bytes:,} bytes of "
                      "data: a damaged or truncated safetensors file")
    elements = math.prod(shape)
    span = offsets[1] - offsets[0]
    bits = DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
    if bits is not None and -(-elements * bits // 8) != span:
        raise _refuse(file, at + ("shape",), f"{_dims(shape)} {dtype} is "
                                             f"{_size(-(-elements * bits // 8))} but its "
                      f"data_offsets hold {span:,} bytes")
    # a dtype forge does not know: still no element under one bit
    if bits is None and elements > span * 8:
        raise _refuse(file, at + ("shape",), f"{_dims(shape)} has more elements than bits in its "
                                             f"{span:,} bytes")
    return elements


def _dims(shape: list) -> str:
    return (
        "shape [" + ", ".join(str(d) if d < 10**12 else f"{len(str(d))}-digit" for d in shape) + "]"
    )


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 10**18 else f"a {len(str(n))}-digit number of bytes"
