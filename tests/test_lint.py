"""The code passes ruff's conservative rule set (pyproject.toml, [tool.ruff]): no undefined or
unused names, no unused imports, no statement-level slips. ruff comes with the [dev] extra; the CI
command also runs it first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff is in the [dev] extra: pip install -e '.[dev]'")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
