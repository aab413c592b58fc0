"""The suite is hermetic: every test has a FORGE_HOME of its own (tests/conftest.py), so nothing a
test provisions lands in, or is read from, the user's ~/.forge."""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from forge.machine import registry
from tests.forge_cli import REPO, forge_argv, forge_env

INSTANT = REPO / "tests" / "reliability" / "fixtures" / "nodes" / "instant.yaml"


def test_each_test_has_its_own_forge_home(forge_home):
    assert os.environ["FORGE_HOME"] == str(forge_home) and registry.home() == forge_home
    assert forge_home != Path.home() / ".forge" and not forge_home.is_relative_to(
        Path.home() / ".forge"
    )


def test_registering_a_node_writes_under_the_tests_forge_home_only(
    forge_home, tmp_path, monkeypatch
):
    user_home = tmp_path / "user"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))  # where ~/.forge would be, were FORGE_HOME ignored
    try:
        path = registry.register(
            "hermetic", {"control_url": "http://127.0.0.1:1", "source": "x.yaml"}
        )
        assert path == forge_home / "nodes" / "hermetic.json" and [
            n["node"] for n in registry.nodes()
        ] == ["hermetic"]
    finally:
        registry.unregister("hermetic")
    assert not (user_home / ".forge").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_provisioned_node_leaves_the_users_forge_home_untouched(forge_home, tmp_path):
    """`forge provision` as a user runs it, with HOME pointed at an empty folder: the node registers
    in the test's FORGE_HOME (which the subprocess inherits) and `~/.forge` is never made."""
    user_home = tmp_path / "user"
    user_home.mkdir()
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        forge_argv("provision", INSTANT, "--port", 0, "--ready-file", ready),
        cwd=REPO,
        env=forge_env({"HOME": str(user_home)}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(900):
            if ready.exists() or proc.poll() is not None:
                break
            __import__("time").sleep(0.1)
        assert ready.exists(), (
            proc.stderr.read() if proc.poll() is not None else "not ready in 90 s"
        )
        entries = list((forge_home / "nodes").glob("*.json"))
        assert len(entries) == 1, entries
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, err
    assert not (user_home / ".forge").exists()
