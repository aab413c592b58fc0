"""`forge serve` as a user runs it: a subprocess on the embedded node, token-protected, under a
bounded load test of 200 concurrent clients (docs/benchmarks.md has the 2,000-client run), then
SIGTERM: drained, exit 0."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest

from forge.node.endpoint import require_token
from forge.serve.loadtest import LoadConfig, run, spawn_server, stop_server
from tests.serve.conftest import REPO

pytestmark = pytest.mark.engine


def test_off_loopback_needs_a_token():
    from forge.errors import ForgeError

    with pytest.raises(ForgeError, match=r"without a token: set \$FORGE_TOKEN"):
        require_token("0.0.0.0", None, "FORGE_TOKEN", what="forge serve")
    require_token("127.0.0.1", None, "FORGE_TOKEN")
    require_token("0.0.0.0", "s3cret", "FORGE_TOKEN")
    env = {k: v for k, v in os.environ.items() if k != "FORGE_TOKEN"}
    r = subprocess.run(
        [sys.executable, "-m", "forge", "serve", "functions/classify.py", "--host", "0.0.0.0"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "without a token" in r.stderr


def test_forge_serve_under_200_concurrent_clients(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FORGE_TOKEN", "s3cret")
    proc, url = spawn_server()
    try:
        assert httpx.get(url + "/health").status_code == 200  # open: health checks
        assert httpx.get(url + "/v1/models").status_code == 401  # everything else: token
        assert httpx.get(url + "/openapi.json").status_code == 401
        auth = {"authorization": "Bearer s3cret"}
        assert (
            httpx.get(url + "/v1/models", headers=auth).json()["data"][0]["id"] == "tiny-llama-cpu"
        )
        report = asyncio.run(
            run(url, LoadConfig(clients=200, requests=2, time_limit_s=60, token="s3cret"))
        )
    finally:
        code = stop_server(proc)
    assert code == 0
    assert report["clients_hung"] == 0 and report["clients_crashed"] == 0, report
    assert report["failed"] == 0, report["failures"]
    assert report["completed"] > 0 and report["disconnected"] == 20
    assert report["completed"] + report["refused_429"] == report["attempts"]
    books = report["server_books"]
    assert books["settled"], books
    assert books["abandoned"] >= 1 and books["refused_by_gates"] == report["refused_429"] + \
        report["refused_429_before_disconnect"]
