"""stdout and stderr that a reader may close: `forge run ... 2>&1 | head -1` must not change what a
run does.

A write to a closed pipe (EPIPE) or a closed descriptor (EBADF, EIO) raised out of whatever was
printing: the summary line of a complete run, a progress line. The output was complete and the exit
code said "refused". Here each stream is wrapped once: the first failed write points the descriptor
at /dev/null (so every other holder of it, a logger, a C library, stops failing too) and the message
is dropped; nothing else changes."""
from __future__ import annotations

import os
import sys


class _Tolerant:
    """A text stream whose write and flush never raise OSError. Everything else is the wrapped
    stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.lost = False               # a write failed: from then on this stream goes to /dev/null

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self._silence()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._silence()

    def _silence(self) -> None:
        self.lost = True
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
            self._stream.flush()        # what was buffered now goes to /dev/null
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _fill_closed_descriptors() -> None:
    """A process started with 0, 1 or 2 closed (`>&-`) would hand those numbers to the next files it
    opens: the output or the ledger would become "stderr" for whatever writes there (a card worker
    inherits them too). /dev/null takes them first."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # the lowest free number is fd itself; anything else means it was taken
                os.dup2(null, fd)
                os.close(null)


def guard_std_streams() -> None:
    """Fill closed standard descriptors, then wrap sys.stdout and sys.stderr (once; a stream closed
    before start is None and stays so: print() then writes nothing)."""
    _fill_closed_descriptors()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Tolerant):
            setattr(sys, name, _Tolerant(stream))
