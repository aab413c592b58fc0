"""A checkout in a folder named `forge` (what `git clone .../forge` makes) works as any other: the
README's test command passes inside it (the fast-test guard reads only real starts of forge as
forge: tests/forge_cli.py runs_the_product), and `forge run` started from the folder that holds it
gets card workers of the node's own forge (forge/link/worker_argv.py), not of the clone's top
folder, which the working directory would otherwise put first on a worker's import path. Real
copies, real subprocesses, the real instant engine."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forge_cli import REPO, forge_env

pytestmark = pytest.mark.slow

# An editable install (`pip install -e .`, as the README installs forge) finds forge through a
# finder placed after Python's path search: a folder named `forge` on the path (a clone's top
# folder, a namespace package) wins over it. This sitecustomize gives the test's interpreters that
# same finder for this checkout, and nothing else.
EDITABLE_FINDER = '''
import importlib.machinery, importlib.util, sys

class _EditableForge:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "forge":
            return None
        return importlib.util.spec_from_file_location("forge", {init!r}, submodule_search_locations=[{pkg!r}])

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, _EditableForge)
'''


def clone_named_forge(parent: Path) -> Path:
    """A copy of this checkout's files (tracked and new, as git lists them) in `parent/forge`."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    clone = parent / "forge"
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            dst = clone / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return clone


def test_the_lint_test_passes_in_a_clone_named_forge(tmp_path):
    pytest.importorskip("ruff", reason="ruff is in the [dev] extra")
    clone = clone_named_forge(tmp_path)
    env = forge_env({"PYTHONPATH": str(clone)})
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_lint.py::test_ruff_finds_nothing",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "1 passed" in r.stdout and "error" not in r.stdout, (
        r.stdout[-3000:] + r.stderr
    )


def test_forge_run_from_the_folder_that_holds_a_clone_named_forge(tmp_path):
    clone_named_forge(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    pkg = REPO / "forge"
    (site / "sitecustomize.py").write_text(
        EDITABLE_FINDER.format(init=str(pkg / "__init__.py"), pkg=str(pkg))
    )
    launcher = site / "bin" / "forge"           # what pip's console script does
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom forge.cli import main\nsys.exit(main())\n")
    (tmp_path / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "record {i}"}}\n' for i in range(5))
    )
    env = forge_env({"PYTHONPATH": str(site)})
    r = subprocess.run(
        [
            sys.executable,
            str(launcher),
            "run",
            str(REPO / "tests/reliability/fixtures/functions/echo.py"),
            "--node",
            str(REPO / "tests/reliability/fixtures/nodes/instant.yaml"),
            "--input",
            "in.jsonl",
            "--output",
            "out.jsonl",
            "--progress",
            "off",
            "--no-report",
            "--fresh-node",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "5 done" in r.stderr and len((tmp_path / "out.jsonl").read_text().splitlines()) == 5, (
        r.stderr
    )
