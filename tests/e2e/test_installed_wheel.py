"""forge installed like any other tool: a built wheel in a fresh virtual environment, the main
command run from a folder that is not the checkout. The embedded default node, its contract and the
tiny model must come from the installed package (package data), never from the checkout.

The wheel is built from a copy of the packaging files only (pyproject.toml, README.md, forge/), so
nothing in the checkout is written and nothing outside the package can leak in. The fresh venv
reuses this environment's installed dependencies (torch, transformers, ...) through a .pth line,
without their .pth hooks: the editable install of forge in this environment is not seen there."""
import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO

pytestmark = pytest.mark.engine


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with forge installed from a wheel built here; returns its bin folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "forge", src / "forge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    # forge-bench beside it, as `pip install '.[bench]' ./bench` installs it
    shutil.copytree(
        REPO / "bench",
        tmp / "bench-src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    built = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            tmp / "dist",
            src,
            tmp / "bench-src",
        ]
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp / "dist").glob("forge_llm-*.whl")
    [bench_wheel] = (tmp / "dist").glob("forge_bench-*.whl")

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    target_site = Path(
        _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    # this environment's dependencies, appended after the fresh venv's own site-packages
    # an overlay venv's too
    outer = [*site.getsitepackages(), *(p for p in sys.path if p.endswith("site-packages"))]
    (target_site / "_outer_deps.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    inst = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            py,
            "install",
            "--no-deps",
            "--no-index",
            wheel,
            bench_wheel,
        ]
    )
    assert inst.returncode == 0, inst.stdout + inst.stderr
    return env_dir / "bin"


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "FORGE_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def test_main_command_runs_from_any_folder_on_the_packaged_default(installed, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(REPO / "functions" / "summarize.py", work / "fn.py")
    rows = (REPO / "functions" / "data" / "summarize.jsonl").read_text().splitlines()[:8]
    (work / "in.jsonl").write_text("\n".join(rows) + "\n")
    env = _clean_env(tmp_path / "home")

    where = _run(
        [
            installed / "python",
            "-c",
            "import forge, forge.embedded as e, "
            "forge_bench.cli_actions as b; "
            "print(forge.__file__); print(e.default_node_path()); print(e.TINY_MODEL_DIR); "
            "print(b.QUICK_WORKLOAD if b.QUICK_WORKLOAD.is_file() else 'missing')",
        ],
        cwd=work,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert line.startswith(str(installed.parent)), f"{line} is not inside the installed package"

    r = _run(
        [installed / "forge", "run", "fn.py", "--input", "in.jsonl", "--output", "out.jsonl"],
        cwd=work,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "8 done, 0 failed" in r.stderr, r.stderr
    out = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
    assert sorted(row["index"] for row in out) == list(range(8))
    assert all(isinstance(row["result"]["summary"], str) for row in out)

    # `forge bench` from its entry point
    entry_points = {k: v for k, v in env.items() if k != "FORGE_LOAD_PLUGINS"}
    bench = _run([installed / "forge", "bench", "quick", "--help"], cwd=work, env=entry_points)
    assert bench.returncode == 0 and "forge bench quick" in bench.stdout, bench.stderr

    named = _run([installed / "forge", "provision", "--dry-run", "local"], cwd=work, env=env)
    assert named.returncode == 0, named.stderr
    assert "tiny-llama-cpu" in named.stdout
