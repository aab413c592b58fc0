"""User-facing errors. Anything raised as a ForgeError is printed as one clear line, never a
traceback."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class ForgeError(Exception):
    """An error meant for the user: its message is printed as-is (exit code 1 unless stated)."""

    exit_code = 1


def engine_failed_to_start(card: str, contract: str, why: str | BaseException) -> ForgeError:
    """The one error a card's engine that did not come up is reported with, wherever it is seen (the
    engine's factory, the worker process, its link, the local node, a cluster agent); `why` a line,
    or the exception itself (named by its type)."""
    if isinstance(why, BaseException):
        why = f"{type(why).__name__}: {why}"
    return ForgeError(f"card {card} ({contract}): engine failed to start: {why}")


class UsageError(ForgeError):
    """Bad flags or arguments (exit code 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One validation finding, rendered as `file::$.json.path: message`."""

    file: str            # path as the user should read it (relative to cwd where possible)
    path: str            # JSON path inside the file, "$" for the whole document
    message: str
    severity: str = "error"   # "error" | "warning"

    def render(self) -> str:
        tag = "" if self.severity == "error" else "warning: "
        return f"{self.file}::{self.path}: {tag}{self.message}"


def display_path(p: str | Path) -> str:
    """A path as the user gave it: relative to the current directory when it lies below it, else
    absolute. Symlinks are not resolved: a refusal of `out/x` (a link) names `out/x`, not the file
    the link points to."""
    p = Path(p)
    try:
        return str(Path(os.path.abspath(p)).relative_to(os.path.abspath(os.getcwd())))
    except (ValueError, OSError):
        return str(p)


class ConfigError(ForgeError):
    """One or more problems in user files; the message is every problem, one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(p.render() for p in self.problems))


class EngineUnavailable(ForgeError):
    """An engine backend cannot be used on this machine (missing library, no device)."""


class RequestRejected(ForgeError):
    """A request that no engine on the node can take as asked (geometry, closed node). `param`: the
    request field to change, where one is to blame (an HTTP answer names it)."""

    def __init__(self, message: str = "", *, param: "str | None" = None):
        super().__init__(message)
        self.param = param


class NodeDown(ForgeError):
    """No engine on the node can work any more (all crashed or wedged). Not a record's fault: a job
    stops without writing error rows, and the same command resumes once the node is healthy."""
