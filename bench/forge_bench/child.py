"""One sweep step in its own process, under a time limit: the candidate's (or the confirm's) `forge
bench ...` command runs in a new session, its output into a log file. On the limit, or when the
sweep itself is stopped, the whole process group gets SIGTERM, then SIGKILL: nothing of a candidate
outlives it, and the card memory it held is freed with it."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

KILL_GRACE_S = 10.0


def last_line(path: Path) -> str:
    """The last non-empty line of a log (what a cut or failed step was doing), at most 300
    characters."""
    try:
        lines = [
            ln.strip()
            for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
            if ln.strip()
        ]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class ChildProcess:
    def __init__(self, argv: list[str], log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        with log.open("wb") as fh:  # the child holds its own copy of the descriptor
            self.proc = subprocess.Popen(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait(self, limit_s: float) -> tuple[Optional[int], float, bool]:
        """(exit code or None, seconds, cut): waits at most limit_s, then ends the process group.
        Any exception while waiting (the sweep's SIGTERM, Ctrl-C) ends the group too, then
        propagates."""
        try:
            rc = self.proc.wait(timeout=limit_s)
            return rc, time.monotonic() - self.started, False
        except subprocess.TimeoutExpired:
            self.kill()
            return None, time.monotonic() - self.started, True
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=KILL_GRACE_S)
                return
            except subprocess.TimeoutExpired:
                continue
