"""`forge provision` + `forge deploy` + `forge status` end to end, with real HTTP and real
signals."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e.helpers import REPO, forge, read_output

pytestmark = pytest.mark.engine


@pytest.fixture
def node(tmp_path):
    env = {**os.environ, "FORGE_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    ready = tmp_path / "ready"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "provision",
            "node_descriptions/local.yaml",
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 120, "node did not come up"
        time.sleep(0.1)
    url = ready.read_text().strip()
    print(f"node up in {time.monotonic() - t0:.1f} s at {url}")
    yield proc, url, env
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_provision_serves_deploy_and_drains_on_sigterm(node, tmp_path):
    proc, url, env = node
    with urllib.request.urlopen(url + "/health", timeout=5) as r:
        assert json.load(r)["status"] == "ok"
    st = forge("status", "--json", env=env)
    assert st.returncode == 0, st.stderr
    [entry] = json.loads(st.stdout)
    assert entry["node"] == "local" and entry["live"]["cards"][0]["tier"] == "tiny-llama-cpu"

    out = tmp_path / "out.jsonl"
    r = forge(
        "deploy",
        "functions/summarize.py",
        "--input",
        "functions/data/summarize.jsonl",
        "--output",
        out,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    rows = read_output(out)
    assert sorted(row["index"] for row in rows) == list(range(48))
    assert all(row["result"]["summary"] is not None for row in rows)

    # the node refuses what does not fit its contract, with a reason
    req = urllib.request.Request(
        url + "/v1/generate",
        method="POST",
        headers={"content-type": "application/json"},
        data=json.dumps({"requests": [{"prompt": "hi", "max_tokens": 999}]}).encode(),
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        [res] = json.load(r)["results"]
    assert res["error"]["type"] == "RequestRejected" and "max_output_len" in res["error"]["message"]

    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopped (clean)" in err
    assert json.loads(forge("status", "--json", env=env).stdout) == []


def test_deploy_without_a_node_says_what_to_do(tmp_path):
    r = forge("deploy", "functions/summarize.py", "--input", "functions/data/summarize.jsonl",
              "--output", tmp_path / "o.jsonl", env={"FORGE_HOME": str(tmp_path / "empty")})
    assert r.returncode == 1
    assert "forge provision" in r.stderr and "Traceback" not in r.stderr
