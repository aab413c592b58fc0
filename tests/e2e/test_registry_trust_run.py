"""`forge run` and a registry entry it must not believe, as a user meets them: a planted entry that
points at a logging server, an entry whose URL is not loopback, a malformed entry, and a real warm
node whose entry's URL was rewritten to a proxy that relays to it. Each run says so in one line,
provisions its own node, and no token or record reaches the server forge did not start. Real `forge
run` and `forge provision` processes, real HTTP."""
from __future__ import annotations

import fcntl
import http.client
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from forge.machine import node_proof, registry
from tests.forge_cli import REPO, forge, forge_env, provisioned
from tests.logging_server import LoggingServer

pytestmark = pytest.mark.slow

NODE = REPO / "tests/reliability/fixtures/nodes/instant.yaml"
ECHO = REPO / "tests/reliability/fixtures/functions/echo.py"
TOKEN = {"FORGE_TOKEN": "s3cret-token"}


def _digest(home: Path) -> str:
    """The digest a `forge run` of NODE computes (forge/machine/warm_node.py), in a process like the
    run's."""
    code = ("import sys; from forge.config.load import load_node; from forge.machine.warm_node "
            "import "
            "description_digest; print(description_digest(load_node(sys.argv[1])))")
    return subprocess.run(
        [sys.executable, "-c", code, str(NODE)],
        env=forge_env({"FORGE_HOME": str(home)}),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _plant(home: Path, url: str, text: str | None = None) -> int:
    """nodes/instant.json written as an attacker of the same user would (with a key of its own), its
    lock held here: a node that looks alive. Returns the lock's descriptor."""
    folder = home / "nodes"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = {"node": "instant", "pid": os.getpid(), "control_url": url, "card_transport": "process",
             "description_digest": _digest(home), **registry.origin()}
    (folder / "instant.json").write_text(text if text is not None else json.dumps(entry))
    os.chmod(folder / "instant.json", 0o600)
    (folder / "instant.key").write_text(node_proof.new_key())
    os.chmod(folder / "instant.key", 0o600)
    fd = os.open(folder / "instant.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _run(home: Path, tmp_path: Path, name: str):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": f"record {i}"}) + "\n" for i in range(5)))
    out = tmp_path / f"{name}.jsonl"
    r = forge(
        "run",
        ECHO,
        "--node",
        NODE,
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        env={"FORGE_HOME": str(home), **TOKEN},
    )
    assert r.returncode == 0 and "5 done" in r.stderr, r.stderr[-3000:]
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert len(out.read_text().splitlines()) == 5
    return r


@pytest.fixture
def logger():
    server = LoggingServer()
    yield server
    server.close()


def test_a_planted_entry_pointing_to_a_logging_server_gets_nothing(tmp_path, logger):
    home = tmp_path / "home"
    fd = _plant(home, logger.url)
    try:
        r = _run(home, tmp_path, "planted")
    finally:
        os.close(fd)
    assert (
        f"forge: note: node 'instant' is up (pid {os.getpid()}) but the server at {logger.url} "
        "did not prove it "
        "is that node (nothing was sent to it): provisioning one in this process"
    ) in r.stderr, r.stderr
    assert logger.seen and logger.tokens_or_records() == [], logger.seen
    assert TOKEN["FORGE_TOKEN"] not in json.dumps([str(s) for s in logger.seen])


def test_an_entry_off_loopback_and_a_malformed_entry_are_passed_over(tmp_path):
    home = tmp_path / "home"
    fd = _plant(home, "http://10.255.255.1:9")
    try:
        r = _run(home, tmp_path, "far")
        assert "its registry entry's control URL http://10.255.255.1:9 is not a loopback address: provisioning " \
               "one in this process" in r.stderr, r.stderr
        path = home / "nodes" / "instant.json"
        path.write_text('{"node": "instant", "pid": "abc", "control_url": "http://127.0.0.1:1"}')
        r = _run(home, tmp_path, "malformed")
        assert (
            f"forge: note: skipping {path}: it has 'pid' = 'abc', not a process id" in r.stderr
        ), r.stderr
        st = forge("status", env={"FORGE_HOME": str(home)})
        assert (
            st.returncode == 0
            and f"skipping {path}" in st.stderr
            and "internal error" not in st.stderr
        )
    finally:
        os.close(fd)


class RelayingProxy:
    """An HTTP proxy on 127.0.0.1 that logs each request and relays it to `target` (a real node)."""

    def __init__(self, target: str):
        host, port = target.removeprefix("http://").split(":")
        self.seen: list[dict] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _relay(self):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else None
                seen.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body or b"",
                    }
                )
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                conn.request(self.command, self.path, body=body,
                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                self.send_header(
                    "content-type", answer.getheader("content-type") or "application/json"
                )
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_real_warm_nodes_entry_rewritten_to_a_relaying_proxy_is_refused(tmp_path):
    home = tmp_path / "home"
    with provisioned(home, description=str(NODE)) as node:
        path = home / "nodes" / "instant.json"
        entry = json.loads(path.read_text())
        proxy = RelayingProxy(node["url"])
        try:
            # the user's own file, rewritten
            path.write_text(json.dumps({**entry, "control_url": proxy.url}))
            r = _run(home, tmp_path, "proxied")
            assert f"but the server at {proxy.url} did not prove it is that node" in r.stderr, (
                r.stderr
            )
            leaked = [
                s
                for s in proxy.seen
                if any(k.lower() == "authorization" for k in s["headers"])
                or s["body"]
                or not s["path"].startswith("/health")
            ]
            assert proxy.seen and leaked == [], proxy.seen
        finally:
            proxy.close()
        path.write_text(json.dumps(entry))  # the node's own entry: the node proves itself
        r = _run(home, tmp_path, "warm")
        assert f"forge: using node 'instant', already up (pid {node['proc'].pid})" in r.stderr, (
            r.stderr
        )
