"""The files of $FORGE_HOME/nodes that forge believes: only what it can prove it wrote for this
user.

A registry entry decides where a run sends its token and its records (forge/machine/warm_node.py),
so nothing in one is taken on its word. The folder must be this user's and writable by no one else,
or every command that reads or writes the registry refuses the home in one line (another user could
otherwise plant or swap entries). Each file is opened through the folder's descriptor without
following links, non-blocking (a FIFO cannot hang a read), and believed only when it is a regular
file of this user's, writable by no one else, small, strict JSON (no NaN, no 1e400) and of the shape
`forge provision` writes, its name the node's; anything else is skipped with one line naming the
file. A node's key (NAME.key, for the proof of forge/machine/node_proof.py) must moreover be
readable by this user alone."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

from forge.errors import ForgeError, UsageError

# a node's `node:` (forge/config/models.py Name)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_FILE_BYTES = 64 * 1024
KEY_HEX_CHARS = 64
URL_MAX_CHARS = 2048
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_told: set[tuple[str, str]] = set()      # (file, why) already said to be skipped, in this process


def home() -> Path:
    return Path(os.environ.get("FORGE_HOME", Path.home() / ".forge"))


def folder() -> Path:
    return home() / "nodes"


def check_name(name: Any) -> str:
    """A node name that names a file in the registry's folder and nothing else (no `/`, no `..`)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise UsageError(f"node name {name!r}: a node's name is 1 to 128 letters, digits, '.', '_' "
                         "or '-', "
                         "starting with a letter or digit")
    return name


@contextlib.contextmanager
def opened_folder(create: bool = True) -> Iterator[int]:
    """A descriptor of $FORGE_HOME/nodes, once it is proven this user's and writable by no one else;
    every file of the registry is then reached through it (a folder swapped after the check is never
    the one used)."""
    path = folder()
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise ForgeError(
                f"{path}: cannot create the node registry's folder: {e.strerror}"
            ) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise ForgeError(f"{path}: cannot open the node registry's folder: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        why = None
        if st.st_uid != os.getuid():
            why = f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
        elif st.st_mode & 0o022:
            why = f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        if why is not None:
            raise ForgeError(f"{path} {why}: forge trusts node entries only in a folder of yours "
                             "that no one else "
                             f"may write; set FORGE_HOME to a folder of your own (now {home()})")
        yield fd
    finally:
        os.close(fd)


def _read_own(dfd: int, filename: str, private: bool) -> tuple[Optional[bytes], Optional[str]]:
    """(bytes, None) from a regular file of this user's that no one else may write (with private,
    nor read); (None, why not); (None, None) when there is no such file."""
    try:
        fd = os.open(filename, _OPEN_FLAGS, dir_fd=dfd)
    except FileNotFoundError:
        return None, None
    except OSError as e:            # ELOOP: a symbolic link
        return None, f"cannot be opened without following links ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "is not a regular file"
        if st.st_uid != os.getuid():
            return None, f"is owned by uid {st.st_uid}, not by you"
        if st.st_mode & (0o077 if private else 0o022):
            return None, f"is {'readable' if private else 'writable'} by others (mode {stat.S_IMODE(st.st_mode):o})"
        if st.st_size > MAX_FILE_BYTES:
            return None, f"is {st.st_size:,} bytes, more than an entry holds"
        return os.read(fd, MAX_FILE_BYTES + 1), None
    finally:
        os.close(fd)


def _no_constant(text: str):
    raise ValueError(f"{text} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _is_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


# field -> (check, what it must be); `node`, `pid` and `control_url` are required
_FIELDS = {
    "node": (lambda v: isinstance(v, str) and NAME.fullmatch(v) is not None, "a node name"),
    "pid": (lambda v: _is_int(v, 1, 2**31 - 1), "a process id"),
    "control_url": (
        lambda v: (
            isinstance(v, str) and v.startswith(("http://", "https://")) and len(v) <= URL_MAX_CHARS
        ),
        "an http(s) URL",
    ),
    "metrics_url": (
        lambda v: v is None or (isinstance(v, str) and len(v) <= URL_MAX_CHARS),
        "a URL",
    ),
    "uid": (lambda v: _is_int(v, 0, 2**32 - 1), "a user id"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "checkout": (lambda v: isinstance(v, str), "a folder"),
    "source": (lambda v: v is None or isinstance(v, str), "a path"),
    "started_at": (lambda v: type(v) in (int, float), "a time"),
    "description_digest": (lambda v: isinstance(v, str), "a digest"),
    "card_transport": (lambda v: isinstance(v, str), "a string"),
    "cards": (
        lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v),
        "a list of card names",
    ),
}
REQUIRED = ("node", "pid", "control_url")


def _entry_of(data: bytes, stem: str) -> tuple[Optional[dict], Optional[str]]:
    try:
        info = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError is a ValueError
        return None, f"is not strict JSON ({type(e).__name__}: {str(e)[:80]})"
    if not isinstance(info, dict):
        return None, "is not a JSON object"
    for key in REQUIRED:
        if key not in info:
            return None, f"has no {key!r}"
    for key, (ok, what) in _FIELDS.items():
        if key in info and not ok(info[key]):
            return None, f"has {key!r} = {str(info[key])[:40]!r}, not {what}"
    if info["node"] != stem:
        return None, f"names node {info['node']!r}, not {stem!r} as its file name does"
    return info, None


def skipped(path: Path, why: str) -> None:
    """One line, once per file and reason in a process, for an entry forge does not believe."""
    if (str(path), why) not in _told:
        _told.add((str(path), why))
        print(f"forge: note: skipping {path}: it {why}", file=sys.stderr, flush=True)


def read_entries(dfd: int) -> list[tuple[str, dict]]:
    """(file name, entry) of every entry forge believes, this user's uid in it; the others are
    skipped, each with one line naming its file."""
    out = []
    for filename in sorted(os.listdir(dfd)):
        if not filename.endswith(".json"):
            continue
        stem = filename[: -len(".json")]
        data, why = _read_own(dfd, filename, private=False)
        if data is not None:
            info, why = _entry_of(data, stem)
            if info is not None:
                out.append((filename, {**info, "uid": os.getuid()}))
                continue
        if why is not None:
            skipped(folder() / filename, why)
    return out


def read_key(dfd: int, name: str) -> tuple[Optional[str], Optional[str]]:
    """(the node's key, None), or (None, why there is none forge believes)."""
    data, why = _read_own(dfd, f"{check_name(name)}.key", private=True)
    if data is None:
        return None, why or "is missing (a node of an older forge, or not one forge started)"
    key = data.decode("ascii", "replace").strip()
    if len(key) != KEY_HEX_CHARS or any(c not in "0123456789abcdef" for c in key):
        return None, "holds no key"
    return key, None


def write_private(dfd: int, filename: str, data: bytes) -> None:
    """Write a file of the registry whole (a temporary file, then a rename), readable by this user
    alone."""
    tmp = f".{filename}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dfd)
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, filename, src_dir_fd=dfd, dst_dir_fd=dfd)
