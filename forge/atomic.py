"""Every file forge writes beside a user's files is written the same way: into a fresh temp file in
the target folder (mkstemp: O_EXCL, a name no other file has, never followed through a link), then
renamed over the target. A file sitting at a guessable temp name (the input, a symlink to anything)
is never written into, and the target itself is replaced as a whole, never written through if it is
a link."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def replace_file(
    path: str | os.PathLike, write: Callable[[BinaryIO], object], *, fsync: bool = False
) -> Path:
    """Call `write(f)` on a fresh temp file beside `path`, then rename it over `path`. On any
    failure the temp file is removed and `path` is untouched."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # what a plain open() would have given, not mkstemp's owner-only mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise
    return path


def replace_text(path: str | os.PathLike, text: str) -> Path:
    """`replace_file` for a UTF-8 text."""
    data = text.encode("utf-8")
    return replace_file(path, lambda f: f.write(data))


def save_figure(fig, path: str | os.PathLike) -> Path:
    """A matplotlib figure saved as PNG the same way (savefig to a path would follow a link sitting
    there)."""
    return replace_file(path, lambda f: fig.savefig(f, format="png"))
