"""A card worker's engine library logs to a file beside its node; the console keeps forge's own
lines.

vLLM, torch and transformers write to the process's stdout and stderr, through Python's logging and
warnings and from C code alike (a vLLM CPU load printed ~25 lines: LD_PRELOAD, Triton, NUMA,
deprecations), and they broke the job's progress bar. A worker therefore points file descriptors 1
and 2 at its card's log file before any engine library is imported, so whatever those libraries
write lands there, and keeps a copy of the console for:

- forge's own log lines (loggers under `forge`, WARNING and up, as the node prints its own);
- one line per class of warning that matters from any other library (ERROR and up, and WARNING
  except the classes every load prints that say nothing about this job: NOISE below), naming the
  file where the rest is.

The file's path is said once, when the worker starts: `$FORGE_HOME/logs/NODE/CARD.log` (appended to,
so a restarted worker's lines follow its predecessor's)."""
from __future__ import annotations

import fcntl
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import IO, Optional

from forge.machine.registry import home

CLASSES_MAX = 256           # warning classes remembered (said once each); past it, no more are said
LINE_CHARS = 200            # a warning's first line on the console, cut to this many characters
# Warnings every engine load prints that say nothing about this job: the file has them, the console
# does not. Each names a line a vLLM CPU load prints whatever the job (forge chooses eager mode,
# seeds per request, and a tiny or CPU model): libraries' advice on how they were built or
# preloaded, deprecations, and forge's own choices.
NOISE = re.compile(r"LD_PRELOAD|[Tt]riton|NUMA|numa|[Dd]eprecat|will be removed|FutureWarning|is "
                   r"not supported on CPU"
                   r"|pin_memory|TORCH_CUDA_ARCH_LIST|cudagraph|Compilation config|random "
                   r"seed|Inductor|SSM cache")


def log_path(node: str, card: str) -> Path:
    safe = [re.sub(r"[^A-Za-z0-9._-]", "_", part) or "_" for part in (node, card)]
    return home() / "logs" / safe[0] / f"{safe[1]}.log"


class OncePerClass(logging.Handler):
    """Engine libraries' warnings that matter, one console line per class (its logger and message
    template)."""

    def __init__(self, console: IO[str], card: str, path: Path):
        super().__init__(logging.WARNING)
        self.console, self.card, self.path = console, card, path
        self.seen: set[tuple[str, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if (
            record.levelno < self.level
            or record.name == "forge"
            or record.name.startswith("forge.")
        ):
            return                                  # forge's own lines have their handler
        try:
            text = record.getMessage()
            key = (record.name, str(record.msg)[:LINE_CHARS])
            if (record.levelno < logging.ERROR and NOISE.search(text)) or key in self.seen:
                return
            if len(self.seen) >= CLASSES_MAX:
                return
            self.seen.add(key)
            first = text.strip().splitlines()[0][:LINE_CHARS] if text.strip() else record.name
            library = record.name.split(".")[0] if record.name != "py.warnings" else "python"
            self.console.write(f"forge: card {self.card}: {library} {record.levelname.lower()}: "
                               f"{first} "
                               f"(its log: {self.path})\n")
            self.console.flush()
        except Exception:  # noqa: BLE001 - a console that cannot be written must not fail the engine
            self.handleError(record)


def divert(node: str, card: str) -> Optional[Path]:
    """Point this process's stdout and stderr at the card's log file, forge's lines at the console;
    returns the file's path (None, and nothing changed, when the file cannot be opened: the console
    keeps everything)."""
    path = log_path(node, card)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: the node was started with that stream closed
            stream.flush()
    # the console, taken before the file is opened: a closed fd 2 must not become the file's number
    try:
        console = os.fdopen(
            os.dup(2), "w", buffering=1, encoding="utf-8", errors="backslashreplace"
        )
    except OSError:  # fd 2 closed (`2>&-`): forge's lines go nowhere, as before
        console = open(os.devnull, "w", encoding="utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # above 0-2, which a closed stream may have left free
        fd = fcntl.fcntl(opened, fcntl.F_DUPFD, 3)
        os.close(opened)
    except OSError as e:
        print(f"forge: card {card}: engine logs stay on the console: cannot write {path}: "
              f"{e.strerror}",
              file=console, flush=True)
        console.close()
        return None
    print(f"forge: card {card}: its engine library logs to {path}", file=console, flush=True)
    os.write(fd, f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} card {card} of node {node}, worker pid "
                 f"{os.getpid()}\n".encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if sys.stdout is None:  # a stream closed at start now has the file to write to
        sys.stdout = open(
            1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )
    if sys.stderr is None:
        sys.stderr = open(
            2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )

    ours = logging.StreamHandler(console)  # forge's lines, as the node's own print (bare messages)
    ours.setLevel(logging.WARNING)
    logging.getLogger("forge").addHandler(ours)
    root = logging.getLogger()
    # fd 2: the file, with what forge's lines leave out
    everything = logging.StreamHandler(sys.stderr)
    everything.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(everything)
    root.addHandler(OncePerClass(console, card, path))
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)                   # the libraries' INFO lines go to the file too
    logging.getLogger("forge").propagate = True
    logging.captureWarnings(True)  # warnings.warn -> logging (py.warnings): the file
    return path
