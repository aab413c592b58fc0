"""Reading the data-driven cases under tests/cases/: an `expected.txt` line is

    [warning ]FILE::$.json.path[: part of the message]

and the problems of a case must be exactly those the lines describe (every line matched, every
problem matched by a line). A valid case without expected.txt must produce no problem at all."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge.errors import Problem

CASES = Path(__file__).resolve().parents[1] / "cases"


@dataclass(frozen=True)
class Expected:
    severity: str
    file: str
    path: str
    fragment: str
    line: str

    def matches(self, p: Problem) -> bool:
        return (p.severity, p.file, p.path) == (
            self.severity,
            self.file,
            self.path,
        ) and self.fragment in p.message


def case_dirs(kind: str) -> list[Path]:
    return sorted(d for d in (CASES / kind).iterdir() if d.is_dir())


def read_expected(case: Path) -> list[Expected]:
    path = case / "expected.txt"
    if not path.exists():
        return []
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        severity = "error"
        if line.startswith("warning "):
            severity, line = "warning", line[len("warning "):]
        file, sep, rest = line.partition("::")
        assert sep, f"{path}: a line must look like FILE::$.path[: message part], got {raw!r}"
        loc, _, fragment = rest.partition(": ")
        out.append(Expected(severity, file, loc, fragment, raw.strip()))
    return out


def mismatches(expected: list[Expected], problems: list[Problem]) -> list[str]:
    """Human-readable differences; empty when the problems are exactly what the case expects."""
    out = [
        f"expected, not produced: {e.line}"
        for e in expected
        if not any(e.matches(p) for p in problems)
    ]
    out += [
        f"produced, not expected: {p.render()}"
        for p in problems
        if not any(e.matches(p) for e in expected)
    ]
    return out
