"""`forge serve --remote`: functions and completions served here, generations on a node provisioned
by `forge provision` in another process; a client that leaves cancels the remote engine work too."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.conftest import REPO

pytestmark = pytest.mark.engine


def start(args, ready, env=None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge", *args, "--port", "0", "--ready-file", str(ready)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"forge {args[0]} did not come up: {proc.stderr.read().decode()[-1500:]}")
        time.sleep(0.2)
    return proc, ready.read_text().strip()


def test_serve_against_a_provisioned_node(tmp_path):
    env = {**os.environ, "FORGE_HOME": str(tmp_path / "home")}
    prov, node_url = start(["provision", "node_descriptions/local.yaml"], tmp_path / "node", env)
    try:
        srv, url = start(
            ["serve", "functions/classify.py", "--remote", node_url], tmp_path / "serve", env
        )
        try:
            r = httpx.post(url + "/v1/functions/classify", json={"id": 3, "text": "The roads were "
                                                                                  "closed."},
                           timeout=60)
            assert r.status_code == 200 and isinstance(r.json()["card"], dict), r.text
            r = httpx.post(
                url + "/v1/completions",
                json={
                    "model": "tiny-llama-cpu",
                    "prompt": "Alice was",
                    "max_tokens": 8,
                    "temperature": 0,
                },
                timeout=60,
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 8
            body = {
                "model": "tiny-llama-cpu",
                "prompt": "Alice was beginning to",
                "max_tokens": 40,
                "temperature": 0,
            }
            full = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0][
                "text"
            ]
            stop = next(w for w in (" the", " and", " of", " a") if w in full[3:])
            cut = httpx.post(
                url + "/v1/completions", json={**body, "stop": [stop]}, timeout=60
            ).json()
            # cut on the node, counted there
            assert cut["choices"][0]["text"] == full[:full.index(stop)], cut
            assert (
                cut["choices"][0]["finish_reason"] == "stop"
                and cut["choices"][0]["stop_reason"] == stop
            )
            assert cut["usage"]["completion_tokens"] < 40
            assert httpx.get(url + "/health").json()["remote"] == node_url

            async def leave():
                async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                    body = {
                        "model": "tiny-llama-cpu",
                        "prompt": "1, 2, 3, 4, 5, 6, 7,",
                        "max_tokens": 128,
                        "temperature": 0,
                    }
                    tasks = [
                        asyncio.ensure_future(http.post("/v1/completions", json=body))
                        for _ in range(4)
                    ]
                    await asyncio.sleep(0.3)
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run(leave())
            deadline = time.monotonic() + 20
            while True:
                node = httpx.get(node_url + "/v1/node").json()
                busy = (
                    node["open_requests"]
                    + node["pending"]
                    + sum(c["in_flight"] for c in node["cards"])
                )
                if node["abandoned"] >= 4 and not busy:
                    break
                assert time.monotonic() < deadline, node
                time.sleep(0.1)
        finally:
            srv.send_signal(signal.SIGTERM)
            assert srv.wait(30) == 0
    finally:
        prov.send_signal(signal.SIGTERM)
        prov.wait(60)
