"""Plain `pytest` runs the fast tests: a test that starts forge, a card worker or Ray in a process
of its own must be marked slow (tests/conftest.py fails it otherwise). What counts as starting the
product:"""
import sys

import pytest

from tests.forge_cli import forge_argv, runs_the_product


@pytest.mark.parametrize("argv", [
    forge_argv("run", "fn.py"),
    [sys.executable, "-B", "-m", "forge.host", "7"],
    ["/venv/bin/forge", "provision", "node.yaml"],
    ["ray", "start", "--head"],
    [sys.executable, "-m", "ray.scripts.scripts", "stop"],
    "forge",
    "/venv/bin/forge run fn.py",
])
def test_forge_a_card_worker_or_ray_is_the_product(argv):
    assert runs_the_product(argv)


def test_a_card_worker_is_the_product():
    from forge.link.worker_argv import worker_argv

    assert runs_the_product(worker_argv(7))


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", "print(1)"],
    [sys.executable, "-m", "pytest", "tests/forge_cli.py"],
    ["sh", "-c", "exit 0"],
    ["/tmp/forged/tool", "--forge"],
    [sys.executable, "-m", "ruff", "check", "--no-cache", "/home/me/forge"],  # a clone named forge
    [sys.executable, "/home/me/forge/tests/script.py", "/home/me/forge"],
    ["git", "-C", "/home/me/forge", "status"],
])
def test_other_processes_are_not(argv):
    assert not runs_the_product(argv)


def test_a_fast_test_may_start_another_process():
    import subprocess

    assert (
        subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout
        == "1\n"
    )
