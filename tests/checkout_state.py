"""What a test run may not leave in the checkout: files and folders that were not there before it.

`git status --porcelain --ignored` lists untracked (`??`) and ignored (`!!`) paths, a new folder as
one line; the suite's session start and finish (tests/conftest.py) compare the two lists. Changes to
tracked files are not counted: a developer edits those while the suite runs.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

# pytest's own cache (`--lf`, `--ff` read it): pytest writes it, not a test, and the user asked for
# it
PYTEST_OWN = (".pytest_cache/",)


def new_paths(root: Path, env: Optional[dict] = None) -> Optional[frozenset[str]]:
    """The untracked and ignored paths of the git checkout at `root`; None where there is no git or
    no checkout."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain=v1", "--ignored", "--untracked-files=normal", "-z"],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    entries = [e for e in out.stdout.decode(errors="surrogateescape").split("\0") if e]
    return frozenset(
        e[3:] for e in entries if e[:3] in ("?? ", "!! ") and not e[3:].startswith(PYTEST_OWN)
    )


def left_behind(before: Optional[frozenset[str]], after: Optional[frozenset[str]]) -> list[str]:
    """What the run added to the checkout (nothing where either list is unknown)."""
    if before is None or after is None:
        return []
    return sorted(after - before)
