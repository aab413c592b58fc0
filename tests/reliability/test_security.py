"""A locked-down node, tested with real HTTP against `forge provision` in a subprocess: the control
endpoint binds 127.0.0.1 by default; on any other address it refuses to start without a token, and
then rejects every request without it; /metrics is read-only. No traffic leaves loopback: a node
bound to 0.0.0.0 is reached on 127.0.0.1. Also: YAML cannot execute code, and a description reads
only the paths it names, resolved and reported, without quoting what it finds there."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from forge.config.load import load_paths
from tests.reliability._rel import (
    FIXTURES,
    NODES,
    assert_no_traceback,
    env,
    forge,
    forge_argv,
    record_figures,
)

pytestmark = pytest.mark.timeout(120)
TOKEN = "s3cret-token-for-tests"


class Node:
    """`forge provision NODE --port 0` until stopped; knows its control and metrics URLs."""

    def __init__(self, tmp: Path, node: Path, *args, env_extra=None):
        self.tmp, self.ready = tmp, tmp / "ready"
        self.home = tmp / "forge-home"
        self.err = tmp / "provision.err"
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                forge_argv(
                    "provision",
                    node,
                    "--port",
                    "0",
                    "--metrics-port",
                    "0",
                    "--ready-file",
                    self.ready,
                    *args,
                ),
                env=env(FORGE_HOME=str(self.home), **(env_extra or {})),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        end = time.monotonic() + 60
        while not self.ready.exists() or not self.ready.read_text().endswith("\n"):
            assert self.proc.poll() is None, self.err.read_text()
            assert time.monotonic() < end, "node did not come up"
            time.sleep(0.05)
        self.control_url = self.ready.read_text().strip()
        info = json.loads(next((self.home / "nodes").glob("*.json")).read_text())
        self.metrics_url = info["metrics_url"]
        self.port = int(self.control_url.rsplit(":", 1)[1])
        self.local = f"http://127.0.0.1:{self.port}"      # always connect over loopback

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def _listening(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:       # 0A = LISTEN
                if len(addr) == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
                else:
                    found.add(addr)
    return found


def test_control_endpoint_binds_loopback_by_default(tmp_path):
    node = Node(tmp_path, NODES / "instant.yaml")
    try:
        assert node.control_url.startswith("http://127.0.0.1:")
        assert _listening(node.port) == {"127.0.0.1"}
        r = httpx.get(f"{node.local}/v1/node", timeout=10)
        assert r.status_code == 200 and r.json()["node"] == "instant"
        r = httpx.post(
            f"{node.local}/v1/generate",
            json={"requests": [{"prompt": "hi", "max_tokens": 2}]},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["results"][0]["output_tokens"] == 2
        metrics_port = int(node.metrics_url.rsplit(":", 1)[1].split("/")[0])
        assert _listening(metrics_port) == {"127.0.0.1"}
    finally:
        assert node.stop() == 0, node.err.read_text()
    assert not list((node.home / "nodes").glob("*.json"))        # the registry entry is gone


@pytest.mark.parametrize("how", ["node-file", "flag", "flag-public-address"])
def test_non_loopback_without_token_refuses_to_start(tmp_path, how):
    node, args = {
        "node-file": (NODES / "exposed.yaml", []),
        "flag": (NODES / "instant.yaml", ["--host", "0.0.0.0"]),
        "flag-public-address": (NODES / "instant.yaml", ["--host", "203.0.113.7"]),
    }[how]
    t0 = time.monotonic()
    r = forge(
        "provision",
        node,
        "--port",
        "0",
        *args,
        env_extra={"FORGE_HOME": str(tmp_path), "FORGE_TOKEN": ""},
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forge: refusing to bind the control endpoint "
                                                   "to ")
    assert "without a token: set $FORGE_TOKEN" in lines[0]
    assert_no_traceback(r.stderr)
    assert time.monotonic() - t0 < 30  # refused before any engine was loaded


def test_non_loopback_with_token_requires_it_on_every_request(tmp_path):
    node = Node(tmp_path, NODES / "exposed.yaml", env_extra={"FORGE_TOKEN": TOKEN})
    results = {}
    try:
        assert _listening(node.port) == {"0.0.0.0"}
        gen = {"requests": [{"prompt": "hi", "max_tokens": 2}]}
        cases = {
            "no token": {},
            "wrong token": {"Authorization": "Bearer nope"},
            "token without Bearer": {"Authorization": TOKEN},
            "lower-case scheme": {"Authorization": f"bearer {TOKEN}"},
            "token prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
            "token plus junk": {"Authorization": f"Bearer {TOKEN}x"},
            "basic auth": {"Authorization": "Basic " + TOKEN},
            "other header": {"X-Forge-Token": TOKEN},
        }
        for name, headers in cases.items():
            for method, path, body in (("GET", "/v1/node", None), ("GET", "/v1/stats", None),
                                       ("POST", "/v1/generate", gen)):
                r = httpx.request(
                    method, f"{node.local}{path}", headers=headers, json=body, timeout=10
                )
                results[(name, method, path)] = r.status_code
                assert r.status_code == 401, (name, method, path, r.status_code, r.text)
        r = httpx.get(f"{node.local}/v1/node", params={"token": TOKEN}, timeout=10)
        assert r.status_code == 401                               # not in the query string either
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{node.local}/v1/node", headers=ok, timeout=10).status_code == 200
        r = httpx.post(f"{node.local}/v1/generate", headers=ok, json=gen, timeout=10)
        assert r.status_code == 200 and r.json()["results"][0]["output_tokens"] == 2
        # a token-protected node has no unauthenticated route but the health probe
        for path in (
            "/openapi.json",
            "/docs",
            "/redoc",
            "/V1/node",
            "//v1/node",
            "/v1//node",
            "/%76%31/node",
        ):
            r = httpx.get(f"{node.local}{path}", timeout=10)
            assert r.status_code in (401, 404), (path, r.status_code)
        assert httpx.get(f"{node.local}/health", timeout=10).status_code == 200
    finally:
        assert node.stop() == 0, node.err.read_text()
    record_figures("security-token", requests_without_valid_token=len(results) + 1,
                   all_refused_401=all(v == 401 for v in results.values()))


def test_metrics_endpoint_is_read_only(tmp_path):
    node = Node(tmp_path, NODES / "instant.yaml")
    try:
        url = node.metrics_url
        r = httpx.get(url, timeout=10)
        assert r.status_code == 200 and "forge_" in r.text
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            r = httpx.request(method, url, content=b"forge_x 1\n", timeout=10)
            assert r.status_code >= 400, (method, r.status_code)
        assert httpx.get(url, timeout=10).text.count("forge_x") == 0
    finally:
        assert node.stop() == 0, node.err.read_text()


# --- descriptions cannot run code or read what they do not name
# ------------------------------------------------
TAGS = ["!!python/object/apply:os.system ['touch {marker}']", "!!python/object/new:os.system "
                                                              "['touch {marker}']",
        "!!python/name:os.system", "!!python/module:os", "!!python/object:os.system {{}}"]


@pytest.mark.parametrize("tag", TAGS)
def test_yaml_tags_cannot_execute_code(tmp_path, tag):
    marker = tmp_path / "pwned"
    text = (FIXTURES / "nodes" / "instant.yaml").read_text().replace("node: instant", "node: " +
                                                                        tag.format(marker=marker))
    path = tmp_path / "evil.yaml"
    path.write_text(text)
    r = forge("validate", path, env_extra={"FORGE_HOME": str(tmp_path)})
    assert r.returncode == 1 and not marker.exists(), r.stdout + r.stderr
    assert_no_traceback(r.stdout + r.stderr)
    assert "could not determine a constructor" in r.stdout + r.stderr


def test_backend_and_wraps_names_never_import_code(tmp_path):
    contract = (FIXTURES / "contracts" / "freeze-brief.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        contract.replace("backend: faults", "backend: os.system").replace(
            "wraps: instant", "wraps: ../../evil"
        )
    )
    loaded = load_paths([bad])
    messages = [p.render() for p in loaded.problems]
    assert any("$.backend: unknown backend 'os.system'" in m for m in messages), messages
    assert any("$.faults.wraps" in m for m in messages), messages


def test_paths_are_resolved_reported_and_not_quoted(tmp_path):
    """A description may name any path; forge reads only those, reports each resolved, and never
    echoes the content of a file that is not YAML it understands (an .env, a key) into its
    messages."""
    secret = tmp_path / "outside" / ".env"
    secret.parent.mkdir()
    secret.write_text("OPENAI_API_KEY=sk-live-DO-NOT-PRINT-0123456789\n")
    node = tmp_path / "nodes" / "n.yaml"
    node.parent.mkdir()
    node.write_text((FIXTURES / "nodes" / "instant.yaml").read_text()
                    .replace("contracts: [../contracts/instant-tiny.yaml]",
                             f"contracts: [{FIXTURES / 'contracts' / 'instant-tiny.yaml'}, "
                             "../outside/.env, "
                             "../../../../../../../../../../etc/hostname, /dev/zero]"))
    r = forge("validate", node, cwd=tmp_path, env_extra={"FORGE_HOME": str(tmp_path)})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "sk-live" not in out and "OPENAI_API_KEY" not in out, out
    # resolved, relative to cwd
    assert "outside/.env::$: expected a mapping, got string of" in out, out
    # '../..' resolved to the real path
    assert "/etc/hostname::$" in out or "/etc/hostname" in out, out
    assert "/dev/zero::$: not a regular file" in out, out
    assert_no_traceback(out)
