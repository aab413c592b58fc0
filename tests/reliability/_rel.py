"""Shared pieces of the reliability suite: the real `forge` CLI in subprocesses, inputs, outputs,
ledgers, RSS sampling, and a place to put the figures docs/reliability.md reports."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from tests.forge_cli import forge as forge_process
from tests.forge_cli import forge_argv, forge_env  # noqa: F401 - forge_argv: the suite's modules import it from here

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODES = FIXTURES / "nodes"
FUNCTIONS = FIXTURES / "functions"
ECHO = FUNCTIONS / "echo.py"

# Lines a user must never see.
TRACEBACK_MARKERS = ("Traceback (most recent call last)", "internal error")


def env(**extra: str) -> dict[str, str]:
    return forge_env(extra)


def run_argv(
    target, inp: Path, out: Path, node: Optional[Path] = NODES / "instant.yaml", *extra
) -> list[str]:
    args = [
        "run",
        target,
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        *extra,
    ]
    if node is not None:
        args[2:2] = ["--node", node]
    return forge_argv(*args)


def forge(*args, timeout: float = 120, cwd: Path = REPO, env_extra: Optional[dict] = None,
          preexec_fn=None) -> subprocess.CompletedProcess:
    return forge_process(*args, cwd=cwd, env=env_extra, timeout=timeout, preexec_fn=preexec_fn)


def start(
    argv: Sequence[str],
    *,
    stderr_path: Path,
    cwd: Path = REPO,
    env_extra: Optional[dict] = None,
    preexec_fn=None,
) -> subprocess.Popen:
    err = open(stderr_path, "w")
    try:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env(**(env_extra or {})),
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=preexec_fn,
        )
    finally:
        err.close()


def assert_no_traceback(text: str) -> None:
    for marker in TRACEBACK_MARKERS:
        assert marker not in text, text[-3000:]


# --- inputs ---------------------------------------------------------------------------------------
def echo_record(i: int) -> dict:
    return {"id": i, "text": f"record {i}: " + "the Queen said " * (i % 5)}


def write_echo_input(path: Path, n: int, *, bad_every: int = 0) -> Path:
    """n lines; with bad_every, every bad_every-th line (offset 7) is not JSON (an error row for
    that index)."""
    with open(path, "w") as f:
        for i in range(n):
            if bad_every and i % bad_every == 7:
                f.write("{not json\n")
            else:
                f.write(json.dumps(echo_record(i)) + "\n")
    return path


# --- outputs and ledgers
# -----------------------------------------------------------------------------
def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def indices_of(path: Path) -> list[int]:
    return [r["index"] for r in read_rows(path)]


def settled_now(output: Path, ledger: Path) -> set[int]:
    """Indices durable after a kill: complete output lines + rows settled in the ledger."""
    done: set[int] = set()
    if output.exists():
        for line in output.read_bytes().split(b"\n")[:-1]:  # the last piece is a torn tail or empty
            try:
                done.add(json.loads(line)["index"])
            except ValueError:
                pass
    if ledger.exists():
        db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
        try:
            done |= {i for (i,) in db.execute("SELECT idx FROM records WHERE state != 'pending'")}
        except sqlite3.DatabaseError:    # killed before the schema existed
            pass
        finally:
            db.close()
    return done


def ledger_summary(ledger: Path) -> dict:
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        states = dict(db.execute("SELECT state, COUNT(*) FROM records GROUP BY state").fetchall())
        errors, stored, retried, attempts = db.execute(
            "SELECT COALESCE(SUM(is_error), 0), COALESCE(SUM(row IS NOT NULL), 0), "
            "COALESCE(SUM(attempts > 1), 0), "
            "COALESCE(SUM(attempts), 0) FROM records").fetchone()
    finally:
        db.close()
    return {
        "states": states,
        "errors": errors,
        "stored_rows": stored,
        "retried": retried,
        "attempts": attempts,
    }


def assert_complete(output: Path, ledger: Path, n: int) -> dict:
    """Every input index exactly once in the output, and the ledger agrees (all written, no stored
    rows)."""
    rows = read_rows(output)
    idx = sorted(r["index"] for r in rows)
    assert len(idx) == len(set(idx)), f"duplicated rows: {len(idx) - len(set(idx))}"
    assert idx == list(range(n)), f"missing {sorted(set(range(n)) - set(idx))[:10]}"
    s = ledger_summary(ledger)
    assert s["states"] == {"written": n}, s
    assert s["stored_rows"] == 0, s
    assert s["errors"] == sum("error" in r for r in rows), s
    return s


def resume_report(stderr: str) -> dict:
    """The numbers of forge's 'resuming ...' line (zeros when the run started fresh)."""
    import re

    m = re.search(r"resuming .*?: (\d+) of (\d+) records already settled \((\d+) written now from "
                  r"the ledger, "
                  r"(\d+) torn bytes cut\)", stderr)
    if not m:
        return {"settled": 0, "recovered": 0, "torn_bytes": 0}
    return {"settled": int(m[1]), "recovered": int(m[3]), "torn_bytes": int(m[4])}


def wait_for_growth(path: Path, proc: subprocess.Popen, *, beyond: int, timeout_s: float) -> bool:
    """Wait until `path` is larger than `beyond` bytes (the run is writing rows); False if it ended
    first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        try:
            if path.stat().st_size > beyond:
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    return False


def kill9(proc: subprocess.Popen) -> bool:
    """SIGKILL if still running; True when it was killed (not already finished)."""
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


# --- memory
# -------------------------------------------------------------------------------------------
def rss_kib(pid: int) -> Optional[tuple[int, int]]:
    """(VmRSS, VmHWM) of a live process in KiB. VmHWM is the peak since exec; wait4's ru_maxrss is
    not used because it also counts the pages the child shared with the (large) test process before
    exec."""
    try:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])
    except (FileNotFoundError, ProcessLookupError, KeyError, ValueError):
        return None


class RssSampler(threading.Thread):
    """Samples a process's RSS (from /proc) every `every_s`; `samples` is [(t, kib)], `peak_kib` the
    highest VmHWM seen (the peak up to the last sample)."""

    def __init__(self, pid: int, every_s: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, int]] = []
        self.hwm_kib = 0
        self._halt = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            got = rss_kib(self.pid)
            if got is None:
                return
            self.samples.append((time.monotonic() - self.t0, got[0]))
            self.hwm_kib = max(self.hwm_kib, got[1])
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    @property
    def peak_kib(self) -> int:
        return max([self.hwm_kib] + [k for _, k in self.samples])


# --- figures
# -------------------------------------------------------------------------------------------
def record_figures(name: str, **figures) -> None:
    """Print the figures (visible with -s) and, with FORGE_RELIABILITY_FIGURES=path, append them as
    JSON."""
    line = json.dumps({"test": name, **figures}, sort_keys=True, default=str)
    print(f"\nFIGURES {line}")
    target = os.environ.get("FORGE_RELIABILITY_FIGURES")
    if target:
        with open(target, "a") as f:
            f.write(line + "\n")
