"""`forge top` as a user runs it, against a real provisioned node (the embedded tiny model) under
load: `--once` headless, and the live view in a real terminal (tmux; skipped where tmux is
absent)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.installed import skip_module_unless_installed

skip_module_unless_installed("torch", "transformers")
pytestmark = [pytest.mark.engine, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^cpu0\s+tiny-llama-cpu\s+(ok|DOWN)\s+([\d,]+|…)\s+([\d,]+|…)", re.M)


from tests.forge_cli import forge, provisioned as provisioned_node  # noqa: E402 - after the engine checks above


def provisioned(home: Path):
    """A node brought up as users do (`forge provision node_descriptions/local.yaml`) on free ports,
    in its own FORGE_HOME. COLUMNS pinned: these tests read the whole table (a pytest-xdist worker
    inherits whatever width its terminal had; the 80-column form is
    tests/e2e/test_screens_fit.py's)."""
    return provisioned_node(home, env={"COLUMNS": "160", "FORGE_TOKEN": None})


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with provisioned(tmp_path_factory.mktemp("forge-home")) as n:
        yield n


class Load:
    """Keeps the node busy with real generate batches until stopped (bounded: each POST has a
    timeout)."""

    def __init__(self, url: str):
        self.url, self.stop, self.done, self.errors = url, threading.Event(), 0, []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            n = 0
            while not self.stop.is_set():
                batch = [
                    {
                        "prompt": f"Alice was beginning to get very tired {n + i} times",
                        "max_tokens": 24,
                        "temperature": 0.7,
                    }
                    for i in range(16)
                ]
                r = client.post("/v1/generate", json={"requests": batch})
                r.raise_for_status()
                self.errors += [x["error"] for x in r.json()["results"] if "error" in x][
                    : 10 - len(self.errors)
                ]
                n += len(batch)
                self.done = n

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)
        assert not self.errors, self.errors


def test_once_under_load_shows_the_card_with_tokens_flowing(node):
    with Load(node["url"]):
        # the one node registered here
        r = forge("top", "--once", "--interval", "2", env=node["env"])
    assert r.returncode == 0, r.stderr
    m = ROW.search(r.stdout)
    assert m, r.stdout
    health, gen_tps, prompt_tps = m.groups()
    assert health == "ok"
    assert int(gen_tps.replace(",", "")) > 0 and int(prompt_tps.replace(",", "")) > 0, r.stdout
    assert f"node local  {node['url']}  ok  1 card(s)  every 2 s" in r.stdout
    assert re.search(r"generated [\d,]+ tok/s · prompt [\d,]+ tok/s", r.stdout)


def test_once_by_name_when_idle_reads_zero(node):
    time.sleep(1.5)                                   # let the previous test's requests finish
    r = forge("top", "--node", "local", "--once", "--interval", "0.5", env=node["env"])
    assert r.returncode == 0, r.stderr
    assert ROW.search(r.stdout).groups() == ("ok", "0", "0"), r.stdout


def test_unreachable_and_unknown_nodes_are_one_line(node):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = forge("top", "--node", f"http://127.0.0.1:{port}", "--once", env=node["env"])
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == (f"forge: node at http://127.0.0.1:{port} is unreachable: [Errno "
                                "111] "
                                "Connection refused (is `forge provision` running?)")
    r = forge("top", "--node", "nosuch", "--once", env=node["env"])
    assert (
        r.returncode == 1
        and len(r.stderr.strip().splitlines()) == 1
        and "running: local" in r.stderr
    )


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_live_view_in_a_real_terminal_and_ctrl_c_exits_0(node, tmp_path):
    sock = f"forge-top-test-{os.getpid()}"

    def tmux(*args) -> str:
        # env given explicitly: under pytest, readline may have exported COLUMNS=80 at the C level
        # (unseen in os.environ), which tmux would hand to the pane and rich would obey over the
        # real 160 columns. COLUMNS / LINES dropped too: a pytest-xdist worker has them in
        # os.environ (the node's env copies it).
        return subprocess.run(
            ["tmux", "-L", sock, *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            env={k: v for k, v in node["env"].items() if k not in ("COLUMNS", "LINES")},
        ).stdout

    exit_file = tmp_path / "exit-status"
    top = shlex.join([sys.executable, "-m", "forge", "top", "--interval", "0.5"])
    cmd = shlex.join(["bash", "-c", f"{top}; echo $? > {shlex.quote(str(exit_file))}"])
    tmux(
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "30",
        "-c",
        str(REPO),
        cmd,
        ";",
        "set-option",
        "-t",
        "top",
        "remain-on-exit",
        "on",
    )     # keep the screen after exit
    try:
        screen, deadline = "", time.monotonic() + 45
        with Load(node["url"]):
            while time.monotonic() < deadline:
                screen = tmux("capture-pane", "-p", "-t", "top")
                m = ROW.search(screen)
                if m and m.group(2) not in ("…", "0"):
                    break
                time.sleep(0.3)
            else:
                size = tmux("display", "-p", "-t", "top", "#{window_width}x#{window_height}")
                pytest.fail(f"no frame with tokens flowing within 45 s ({size}); last "
                            f"screen:\n{screen}")
        print(screen)                                 # shown with -s: the captured terminal
        assert "forge top  node local" in screen and "Ctrl-C quits" in screen
        tmux("send-keys", "-t", "top", "C-c")
        # bash reaps forge top and records its status: tmux sometimes leaves its dead pane unreaped.
        deadline = time.monotonic() + 15
        while not exit_file.exists() or not exit_file.read_text().strip():
            assert time.monotonic() < deadline, (
                f"no exit on Ctrl-C:\n{tmux('capture-pane', '-p', '-t', 'top')}"
            )
            time.sleep(0.2)
        assert exit_file.read_text().strip() == "0"
        after = tmux("capture-pane", "-p", "-t", "top")
        # the alternate screen is gone
        assert "Traceback" not in after and "forge top  node" not in after
    finally:
        # only our server
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=10)


def test_piped_frames_then_one_line_when_the_node_goes_away(tmp_path):
    with provisioned(tmp_path) as own:
        top = subprocess.Popen(
            [sys.executable, "-m", "forge", "top", "--node", own["url"], "--interval", "0.3"],
            cwd=REPO,
            env=own["env"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = []
        # frame after frame on a pipe
        while sum("forge top  node local" in line for line in seen) < 2:
            line = top.stdout.readline()
            assert line, f"forge top ended early: {top.stderr.read()}"
            seen.append(line)
        own["proc"].send_signal(signal.SIGINT)            # the node drains and exits
        out, err = top.communicate(timeout=30)
    assert top.returncode == 1, err
    assert ROW.search("".join(seen)), seen
    assert err.strip() == (f"forge: node at {own['url']} stopped answering (3 polls in a row): "
                           "[Errno 111] Connection refused"), err
