"""On a machine shared by several checkouts of forge (one FORGE_HOME): `forge status` marks the
nodes another checkout started, `forge deploy` without --node never picks one of them (it says so
and how to choose), and naming one works with a note. Real nodes: one provisioned from a copy of
this checkout, one from this checkout."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.reliability._rel import REPO, assert_no_traceback

pytestmark = pytest.mark.engine


def _env(home, checkout):
    return {
        **os.environ,
        "FORGE_HOME": str(home),
        "PYTHONPATH": str(checkout),
        "PYTHONUNBUFFERED": "1",
        "FORGE_LOAD_PLUGINS": "",
    }


def _forge(args, env, cwd=REPO, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "forge", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _provision(desc, env, cwd, ready):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "provision",
            str(desc),
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    t0 = time.monotonic()
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 120, "node did not come up"
        time.sleep(0.1)
    return proc


@pytest.mark.timeout(500)
def test_nodes_of_another_checkout_are_marked_and_never_picked_unnamed(tmp_path):
    home = tmp_path / "home"
    other = tmp_path / "other-checkout"
    shutil.copytree(REPO / "forge", other / "forge", ignore=shutil.ignore_patterns("__pycache__"))
    theirs_env, mine_env = _env(home, other), _env(home, REPO)
    procs = [_provision("local", theirs_env, other, tmp_path / "ready-theirs")]
    try:
        st = _forge(["status", "--json"], mine_env)
        [entry] = json.loads(st.stdout)
        assert entry["node"] == "local" and entry["whose"] == f"from another checkout, {other}"
        st = _forge(["status"], mine_env, timeout=60)
        assert st.returncode == 0 and "local *" in st.stdout
        assert f"* not this checkout's: from another checkout, {other}" in st.stdout

        inp = tmp_path / "in.jsonl"
        inp.write_text(
            "".join(json.dumps({"id": i, "text": f"record {i}"}) + "\n" for i in range(4))
        )
        deploy = [
            "deploy",
            "functions/summarize.py",
            "--input",
            inp,
            "--progress",
            "off",
            "--no-report",
        ]
        r = _forge([*deploy, "--output", tmp_path / "a.jsonl"], mine_env)
        assert r.returncode == 2, r.stderr
        assert f"no node started from this checkout ({REPO}) is provisioned; running here: local (from another " \
               f"checkout, {other}): pass --node NAME to use one of them" in r.stderr
        assert not (tmp_path / "a.jsonl").exists()

        r = _forge([*deploy, "--output", tmp_path / "b.jsonl", "--node", "local"], mine_env)
        assert r.returncode == 0, r.stderr
        assert f"forge: note: node 'local' is from another checkout, {other} (not started from this checkout)" \
               in r.stderr

        # the same name from this checkout: refused, saying whose it is and how to keep apart
        r = _forge(["provision", "local", "--port", "0"], mine_env, timeout=120)
        assert r.returncode == 1
        assert "a node named 'local' is already provisioned on this machine" in r.stderr
        assert "set FORGE_HOME to a folder of your own" in r.stderr
        assert_no_traceback(r.stderr)

        # a node of this checkout's own: deploy picks it by itself
        desc = tmp_path / "mine.yaml"
        text = (
            (REPO / "node_descriptions" / "local.yaml")
            .read_text()
            .replace("node: local", "node: mine")
        )
        desc.write_text(text.replace("../forge/embedded/", f"{REPO}/forge/embedded/"))
        procs.append(_provision(desc, mine_env, REPO, tmp_path / "ready-mine"))
        r = _forge([*deploy, "--output", tmp_path / "c.jsonl"], mine_env)
        assert r.returncode == 0, r.stderr
        assert "note:" not in r.stderr
        assert "forge: summarize on mine:" in r.stderr
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
