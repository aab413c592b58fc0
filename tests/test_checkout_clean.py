"""The suite leaves the checkout as it found it: tests/conftest.py compares the checkout's untracked
and ignored paths (tests/checkout_state.py) at the session's start and finish and fails a run that
added any; bytecode goes to a cache in the temp folder (PYTHONPYCACHEPREFIX), Hypothesis' database
beside it, every test's files to tmp_path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkout_state import left_behind, new_paths

ROOT = Path(__file__).resolve().parent.parent


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=60)


@pytest.fixture
def repo(tmp_path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no git")
    git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("runs/\n__pycache__/\n")
    (tmp_path / "kept.py").write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "mine.txt").write_text("a file the developer had before the run\n")
    return tmp_path


def test_what_a_run_adds_is_left_behind_and_nothing_else(repo):
    before = new_paths(repo)
    assert before == {"mine.txt"}
    (repo / "runs").mkdir()
    (repo / "runs" / "out.jsonl").write_text("{}\n")                  # ignored, new: the suite's
    (repo / "pkg" / "__pycache__").mkdir(parents=True)
    (repo / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"")
    (repo / "stray.jsonl").write_text("{}\n")  # untracked, new: the suite's
    (repo / "kept.py").write_text("x = 2\n")   # a tracked file edited: the developer's
    (repo / ".pytest_cache").mkdir()           # pytest's own cache
    (repo / ".pytest_cache" / "README.md").write_text("pytest\n")
    assert left_behind(before, new_paths(repo)) == ["pkg/", "runs/", "stray.jsonl"]


def test_outside_a_git_checkout_nothing_is_compared(tmp_path):
    assert new_paths(tmp_path / "nowhere") is None
    assert left_behind(None, frozenset({"runs/"})) == [] and left_behind(frozenset(), None) == []


def test_the_suites_interpreters_keep_bytecode_out_of_the_checkout(tmp_path):
    """This process and a subprocess started as the tests start one write their bytecode under the
    cache, never into __pycache__ beside the source."""
    prefix = Path(os.environ["PYTHONPYCACHEPREFIX"])
    assert sys.pycache_prefix == str(prefix) and not prefix.is_relative_to(ROOT)
    (tmp_path / "probe_module.py").write_text("X = 1\n")
    subprocess.run(
        [sys.executable, "-c", "import probe_module"],
        cwd=tmp_path,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert not (tmp_path / "__pycache__").exists()
    assert list((prefix / tmp_path.relative_to(tmp_path.anchor)).glob("probe_module.*.pyc"))
