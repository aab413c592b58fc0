"""`--input` as a user gives it: one file, a folder of shards, a glob of shards, or a pipe.

Shards are read in a stable order: sorted by their path (relative to the folder, or as the glob
names them, in code-point order). Every record has one global index, its position in that order: a
shard's first record's index is the number of records in the shards before it, so index =
offset(shard) + line in shard (0-based). The shard set is part of the run's identity (how many
shards, their total size, a hash of each one's path, size, first and last MiB), so a resume over
another shard set is refused like a resume over a changed file.

Formats by suffix: .parquet/.pq (Parquet); .gz (gzip'd JSONL); .zst/.zstd (zstandard'd JSONL, when
the `zstandard` module is importable); anything else is JSONL. A folder is read recursively; its
files whose names start with "." or "_" (`_SUCCESS`, `.crc`) and files of other suffixes are left
out, and so are forge's own files beside an output (its report, ledger, a Parquet run's staging
file: forge/records/side_files.py), which a folder or a glob never gives as shards (`skipped` lists
them, and the run says so). A single `.gz`/`.zst` file is that file only: an output beside it is not
among its shards.

A pipe (`--input -` for standard input, or `--input <(zcat x.gz)`) is read once, as it comes: its
length is unknown until it ends, and it cannot be read again, so such a run cannot resume (it is
refused over an earlier run's output or ledger unless --restart)."""
from __future__ import annotations

import glob
import gzip
import hashlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from forge import constants
from forge.errors import ForgeError, display_path
from forge.records.reader import PARQUET_SUFFIXES, InputError, RecordSource, open_records
from forge.records.guard import same_file
from forge.records.side_files import LEDGER_SUFFIXES, STAGING_SUFFIX, forge_side_file

GZIP_SUFFIXES = (".gz",)
ZSTD_SUFFIXES = (".zst", ".zstd")
# What a folder contributes: JSONL (plain or compressed) and Parquet; other files beside them are
# not records.
_JSONL_NAMES = (".jsonl", ".ndjson", ".json")
FOLDER_SUFFIXES = (
    tuple(j + c for j in _JSONL_NAMES for c in ("", *GZIP_SUFFIXES, *ZSTD_SUFFIXES))
    + PARQUET_SUFFIXES
)
_GLOB_CHARS = set("*?[")
_HEAD_TAIL = 1 << 20

Records = Iterator[tuple[int, "dict | InputError"]]


class CompressedShard(RecordSource):
    """A gzip or zstandard JSONL file: read through the decompressor; identity is of the compressed
    bytes."""

    def __init__(self, path: Path, codec: str, *, max_line_bytes: int) -> None:
        super().__init__(path, "jsonl", max_line_bytes=max_line_bytes)
        self.codec = codec

    def _open_bytes(self):
        if self.codec == "gzip":
            return gzip.open(self.path, "rb")
        from forge.records.zstd import open_zstd

        # refuses a file cut short, as gzip does (forge/records/zstd.py)
        return open_zstd(self.path)

    def count(self) -> int:
        try:
            # reads the whole archive: a damaged one is refused before the run
            return super().count()
        except (OSError, EOFError, ValueError) as e:
            raise self._damaged(e) from None

    def _jsonl_records(self, skip):
        try:
            yield from super()._jsonl_records(skip)
        # a corrupt or truncated archive: name the shard, no traceback
        except (OSError, EOFError, ValueError) as e:
            raise self._damaged(e) from None

    def _damaged(self, e: BaseException) -> ForgeError:
        return ForgeError(f"{display_path(self.path)}: cannot decompress ({self.codec}): {e}")


def open_shard(path: Path, *, max_line_bytes: int = constants.MAX_INPUT_LINE_BYTES) -> RecordSource:
    """One file by its suffix (refused in one line when it cannot be read, or needs a module not
    installed)."""
    name = path.name.lower()
    if name.endswith(GZIP_SUFFIXES) or name.endswith(ZSTD_SUFFIXES):
        open_records(path, max_line_bytes=max_line_bytes)        # exists, a regular file, readable
        codec = "gzip" if name.endswith(GZIP_SUFFIXES) else "zstandard"
        if codec == "zstandard":
            try:
                import zstandard  # noqa: F401
            except ImportError:
                raise ForgeError(f"{display_path(path)}: reading .zst needs the zstandard module, "
                                 "which is not "
                                 "installed (pip install zstandard)") from None
        return CompressedShard(path, codec, max_line_bytes=max_line_bytes)
    return open_records(path, max_line_bytes=max_line_bytes)


class ShardedSource:
    """Several shards read as one input (the interface of RecordSource: records(skip), count(),
    fingerprint())."""

    is_pipe = False

    def __init__(
        self,
        given: str,
        shards: list[RecordSource],
        *,
        root: Path | None,
        single: bool = False,
        skipped: tuple[tuple[Path, str], ...] = (),
    ) -> None:
        """`single`: one compressed file given by name (its only shard); `skipped`: forge's own
        files the folder or glob holds, each with what it is, left out."""
        self.given, self.shards, self.root = given, shards, root
        self.single, self.skipped = single, skipped
        self.path = Path(given)
        self._counts: list[int] | None = None
        self._first_ids: list[list] | None = None

    def __iter__(self) -> Records:
        return self.records()

    def count(self) -> int:
        self._counts = [s.count() for s in self.shards]
        return sum(self._counts)

    def offsets(self) -> list[int]:
        """The global index of each shard's first record."""
        if self._counts is None:
            self.count()
        out, at = [], 0
        for n in self._counts:
            out.append(at)
            at += n
        return out

    def records(self, skip: Callable[[int], bool] | None = None) -> Records:
        counts = self._counts if self._counts is not None else [s.count() for s in self.shards]
        at = 0
        for shard, n in zip(self.shards, counts):
            base = at
            at += n
            if skip is not None and all(skip(i) for i in range(base, base + n)):
                continue        # a wholly settled shard is not even opened
            local_skip = None if skip is None else (lambda i, b=base: skip(b + i))
            for i, record in shard.records(skip=local_skip):
                if i >= n:  # a shard that grew since it was counted: its new lines have no index
                    break
                yield base + i, record

    def fingerprint(self) -> dict[str, object]:
        h = hashlib.sha256()
        size = 0
        ids = []
        for shard in self.shards:
            fp = _file_identity(shard.path)
            size += fp[0]
            h.update(
                f"{self._name(shard.path)}\0{fp[0]}\0{fp[1]}\n".encode("utf-8", "surrogateescape")
            )
            ids.append([self._name(shard.path), *fp])
        if self._first_ids is None and self._counts is not None:
            self._first_ids = [[*i, n] for i, n in zip(ids, self._counts)]
        return {
            "input_size": size,
            "input_shards": len(self.shards),
            "input_sha256_head_tail": h.hexdigest(),
        }

    def shard_ids(self, *, now: bool = False) -> list[list]:
        """[name, size, hash of first and last MiB, records] per shard: what the ledger keeps, so
        that a complete run whose shards were only deleted since is still known complete
        (forge/ledger/shard_set.py). As first taken (fingerprint()), or with `now` as the files are
        now, leaving out shards that are gone."""
        if self._counts is None:
            self.count()
        if not now and self._first_ids is not None:
            return self._first_ids
        ids = []
        for shard, n in zip(self.shards, self._counts):
            try:
                ids.append([self._name(shard.path), *_file_identity(shard.path), n])
            except OSError:
                if not now:
                    raise
        return ids

    def describe(self) -> str:
        return f"{len(self.shards)} shards"

    def _name(self, path: Path) -> str:
        if self.root is not None:
            try:
                return path.relative_to(self.root).as_posix()
            except ValueError:
                pass
        return path.name

    def would_read(self, path: Path) -> bool:
        """Would a later run's --input pick `path` up as a shard? (an output written among the
        shards would be)"""
        p = Path(os.path.abspath(path))
        if self.single:  # that one file: an output beside it is no shard of it
            return any(
                same_file(p, s.path) or p == Path(os.path.abspath(s.path)) for s in self.shards
            )
        if p.name.lower().endswith(_SKIPPED_BY_NAME):
            # a ledger or a staging file: left out of a folder or glob (forge_side_file)
            return False
        if self.root is not None and self.root.is_dir() and not _has_glob(self.given):
            return _in_folder(p, Path(os.path.abspath(self.root))) and p.name.lower().endswith(
                FOLDER_SUFFIXES
            )
        return _glob_matches(self.given, p)


class PipeSource:
    """A pipe, read once as it comes (never counted first: it cannot be read twice)."""

    is_pipe = True
    shards: list = []

    def __init__(self, given: str, stream, *, max_line_bytes: int) -> None:
        self.given, self.path = given, Path(given)
        self._source = _StreamRecords(stream, given, max_line_bytes=max_line_bytes)
        self.read = 0           # records read so far (the total, once the pipe has ended)
        self.ended = False

    def count(self) -> None:
        return None

    def fingerprint(self) -> dict[str, object]:
        return {"input_pipe": self.given}

    def records(self, skip=None) -> Records:
        for i, record in self._source.records():
            self.read = i + 1
            yield i, record
        self.ended = True


class _StreamRecords(RecordSource):
    def __init__(self, stream, given: str, *, max_line_bytes: int) -> None:
        super().__init__(Path(given), "jsonl", max_line_bytes=max_line_bytes)
        self._stream = stream

    def _open_bytes(self):
        return self._stream


def open_input(given: str | os.PathLike, *, max_line_bytes: int = constants.MAX_INPUT_LINE_BYTES):
    """`--input` as given: a RecordSource (one plain file, the run key unchanged from one-file
    runs), a ShardedSource (a folder, a glob, or one compressed file) or a PipeSource. Refused in
    one line when it names nothing readable."""
    text = os.fspath(given)
    if text == "-":
        return PipeSource("-", sys.stdin.buffer, max_line_bytes=max_line_bytes)
    p = Path(text)
    try:
        st = os.stat(p)
    except OSError:
        st = None
    if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        if p.name.lower().endswith(PARQUET_SUFFIXES):
            raise ForgeError(f"{text}: Parquet cannot be read from a pipe (it is read from its "
                             "end): give a file")
        return PipeSource(text, _open_pipe(p, text), max_line_bytes=max_line_bytes)
    if st is not None and stat.S_ISDIR(st.st_mode):
        files, skipped = _without_side_files(_folder_shards(p))
        if not files:
            raise ForgeError(f"{display_path(p)}: the input folder holds no shards (files ending "
                             "in "
                             f"{', '.join(FOLDER_SUFFIXES)}; names starting with '.' or '_' are "
                             "left out, and so "
                             "are forge's own reports, ledgers and staging files)")
        return ShardedSource(
            text,
            [open_shard(f, max_line_bytes=max_line_bytes) for f in files],
            root=p,
            skipped=skipped,
        )
    if st is None and _has_glob(text):
        found = sorted(
            (Path(m) for m in glob.glob(text, recursive=True) if os.path.isfile(m)),
            key=lambda q: str(q),
        )
        files, skipped = _without_side_files(found)
        if not files:
            raise ForgeError(
                f"{text}: the input pattern matches no file"
                + (" but forge's own (reports, ledgers, staging files)" if skipped else "")
            )
        return ShardedSource(
            text,
            [open_shard(f, max_line_bytes=max_line_bytes) for f in files],
            root=None,
            skipped=skipped,
        )
    if st is not None and p.name.lower().endswith(GZIP_SUFFIXES + ZSTD_SUFFIXES):
        return ShardedSource(
            text, [open_shard(p, max_line_bytes=max_line_bytes)], root=p.parent, single=True
        )
    # one file: refused there when missing or unreadable
    return open_records(p, max_line_bytes=max_line_bytes)


FIFO_WRITER_WAIT_S = 10.0      # how long a named FIFO may go without a process writing to it


def _open_pipe(p: Path, text: str):
    """The pipe's read end. Opening a FIFO waits for a writer (`<(cmd)` always has one at once); a
    named FIFO that no process opens for writing within FIFO_WRITER_WAIT_S is refused rather than
    waited on forever."""
    import threading

    got: dict = {}

    def opener() -> None:
        try:
            got["fd"] = os.open(p, os.O_RDONLY)
        except OSError as e:
            got["error"] = e

    t = threading.Thread(target=opener, name="forge-pipe-open", daemon=True)
    t.start()
    t.join(1.0)
    if t.is_alive():
        print(f"forge: --input {text}: waiting up to {FIFO_WRITER_WAIT_S:g} s for a process to "
              "write to it",
              file=sys.stderr, flush=True)
        t.join(FIFO_WRITER_WAIT_S - 1.0)
    if t.is_alive():
        try:                    # release the waiting open: a writer of our own that writes nothing
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        t.join(5.0)
        if "fd" in got:
            os.close(got["fd"])
        raise ForgeError(f"{text}: no process writes to this pipe (none opened it within "
                         f"{FIFO_WRITER_WAIT_S:g} s): "
                         "start its writer first, or give a file")
    if "error" in got:
        raise ForgeError(f"{text}: cannot read the pipe: {got['error'].strerror}")
    return os.fdopen(got["fd"], "rb")


def _folder_shards(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
        for name in filenames:
            if not name.startswith((".", "_")) and name.lower().endswith(FOLDER_SUFFIXES):
                found.append(Path(dirpath) / name)
    return sorted(found, key=lambda q: q.relative_to(root).as_posix())


_SKIPPED_BY_NAME = LEDGER_SUFFIXES + tuple(q + STAGING_SUFFIX for q in PARQUET_SUFFIXES)


def _without_side_files(files: list[Path]) -> tuple[list[Path], tuple[tuple[Path, str], ...]]:
    """(the shards, forge's own files among them with what each is): those are never read as
    input."""
    kept, skipped = [], []
    for f in files:
        what = forge_side_file(f)
        if what is None:
            kept.append(f)
        else:
            skipped.append((f, what))
    return kept, tuple(skipped)


def _file_identity(path: Path) -> tuple[int, str]:
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_HEAD_TAIL))
        if size > 2 * _HEAD_TAIL:
            f.seek(size - _HEAD_TAIL)
        h.update(f.read(_HEAD_TAIL))
    return size, h.hexdigest()


def _has_glob(text: str) -> bool:
    return any(c in _GLOB_CHARS for c in text)


def _in_folder(p: Path, root: Path) -> bool:
    try:
        p.relative_to(root)
        return True
    except ValueError:
        return False


def _glob_matches(pattern: str, p: Path) -> bool:
    """Would glob(pattern) list p (which need not exist yet)? Part by part, as glob matches; `**`
    spans folders."""
    import fnmatch

    want = Path(os.path.abspath(pattern)).parts
    if "**" in want:
        return fnmatch.fnmatch(str(p), os.path.abspath(pattern).replace("**", "*"))
    have = p.parts
    return len(want) == len(have) and all(fnmatch.fnmatchcase(h, w) for h, w in zip(have, want))
