"""A provisioned node as a newcomer meets it: a busy port and a taken name are refused in one line
before any engine loads; `forge status` keeps the URL whole at 80 columns and says plainly when a
node was killed; `forge deploy` to a node that is gone or stuck says what to do. Real processes,
real signals, real HTTP."""
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from forge.report.report import rate_series
from tests.e2e.helpers import REPO, forge

pytestmark = pytest.mark.engine


# `forge ARGS` with -X importtime: the result says whether torch (any engine) was imported.
forge_no_engine = functools.partial(forge, importtime=True, timeout=120)


@pytest.fixture
def home(tmp_path):
    return {"FORGE_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}


def test_busy_port_is_refused_before_any_engine_loads(home):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = forge_no_engine("provision", "node_descriptions/local.yaml", "--port", port, env=home)
        m = forge_no_engine("provision", "local", "--port", 0, "--metrics-port", port, env=home)
        sv = forge_no_engine("serve", "functions/classify.py", "--port", port, env=home)
        rn = forge_no_engine(
            "run",
            "functions/summarize.py",
            "--input",
            "functions/data/summarize.jsonl",
            "--output",
            "/nonexistent-dir-i15a/o.jsonl",
            "--metrics-port",
            port,
            env=home,
        )
    assert r.returncode == 1 and not r.torch_loaded
    assert r.message == (f"forge: control endpoint: port {port} on 127.0.0.1 is already in use; "
                         "pass --port with "
                         "another port (0 picks a free one), or stop what holds it")
    assert (
        m.returncode == 1
        and not m.torch_loaded
        and "metrics endpoint" in m.message
        and "--metrics-port" in m.message
    )
    assert (
        rn.returncode == 1
        and not rn.torch_loaded
        and "--metrics-port with another port" in rn.message
    )
    assert sv.returncode == 1 and not sv.torch_loaded
    assert sv.message == f"forge: forge serve: port {port} on 127.0.0.1 is already in use; pass --port with another " \
                         "port (0 picks a free one), or stop what holds it"


def test_one_name_per_machine_status_at_80_columns_and_kill_9(home, tmp_path):
    ready = tmp_path / "ready"
    env = {**os.environ, **home}
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge", "provision", "local", "--port", "0", "--ready-file", ready],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 120, "node did not come up"
            time.sleep(0.1)
        url = ready.read_text().strip()

        # the same name again (another file describing node `local`): refused at once, the first one
        # untouched
        second = forge_no_engine("provision", "node_descriptions/local.yaml", "--port", 0, env=home)
        assert second.returncode == 1 and not second.torch_loaded
        assert second.message.startswith("forge: a node named 'local' is already provisioned on "
                                         "this machine "
                                         f"(pid {proc.pid}, control {url}, from ")
        st = forge("status", env={**home, "COLUMNS": "80"})
        assert st.returncode == 0, st.stderr
        assert max(len(line) for line in st.stdout.splitlines()) <= 80
        assert f"local: pid {proc.pid} {url}" in st.stdout and "tiny-llama-cpu" in st.stdout

        # a deploy's report has per-card data and a plot with points, as `forge run`'s has
        inp = tmp_path / "in.jsonl"
        inp.write_text(
            "".join((REPO / "functions/data/summarize.jsonl").read_text().splitlines(True)[:12])
        )
        out = tmp_path / "deployed.jsonl"
        dep = forge(
            "deploy",
            "functions/summarize.py",
            "--node",
            "local",
            "--input",
            inp,
            "--output",
            out,
            "--progress",
            "off",
            env=home,
        )
        assert dep.returncode == 0, dep.stderr
        report = json.loads(out.with_name("deployed.jsonl.report.json").read_text())
        [card] = report["cards"]
        assert (card["node"], card["card"], card["tier"]) == ("local", "cpu0", "tiny-llama-cpu")
        assert (
            card["input_tokens"] == report["totals"]["input_tokens"] > 0
            and card["requests"]["ok"] == 12
        )
        assert report["summary"]["cards"][0]["requests"] == 12
        rates = rate_series(
            report["series"]["t_s"],
            [
                None if a is None else a + b
                for a, b in zip(
                    report["series"]["cards"][0]["series"]["input_tokens"],
                    report["series"]["cards"][0]["series"]["output_tokens"],
                )
            ],
        )
        assert sum(1 for r in rates if r) >= 1, report["series"]

        os.kill(proc.pid, signal.SIGSTOP)  # alive but not answering
        stuck = forge(
            "deploy",
            "functions/summarize.py",
            "--input",
            "functions/data/summarize.jsonl",
            "--output",
            tmp_path / "o.jsonl",
            env=home,
        )
        assert stuck.returncode == 1  # a node it names does not answer: refused (README's table)
        assert f"node 'local' (pid {proc.pid}) does not answer at {url}" in stuck.stderr
        assert f"`kill {proc.pid}` ends it" in stuck.stderr and not (tmp_path / "o.jsonl").exists()
    finally:
        proc.kill()
        proc.communicate()

    st = forge("status", env={**home, "COLUMNS": "80"})
    assert (
        "dead" in st.stdout
        and "local: pid" in st.stdout
        and "ended without stopping the node" in st.stdout
    )
    gone = forge("deploy", "functions/summarize.py", "--input", "functions/data/summarize.jsonl",
                 "--output", tmp_path / "o.jsonl", "--node", "local", env=home)
    assert gone.returncode == 1 and "no node named 'local' is provisioned" in gone.stderr
    assert "forge provision" in gone.stderr


# Exit 2 only for a value of the wrong kind (a URL where a description is provisioned); a value of
# the right kind that names nothing there is a refusal, exit 1 (README's table).
@pytest.mark.parametrize("args, expected", [
    (("run", "functions/summarize.py", "--node", "nothere"),
     "forge: --node nothere: not a file, nor a node shipped with forge (local, local-vllm); give a "
     "node description (NODE.yaml)"),
    (("provision", "nothere"),
     "forge: nothere: not a file, nor a node shipped with forge (local, local-vllm); give a node "
     "description (NODE.yaml)"),
    (("run", "functions/summarize.py", "--node", "http://127.0.0.1:1"),
     "forge: --node http://127.0.0.1:1: `forge run` provisions its node in this process from a "
     "description; to use "
     "the node provisioned at that URL, run `forge deploy --node URL`"),
    (("run", "functions/summarize.py", "--node", "missing.yaml"), "forge: --node missing.yaml: no "
                                                                  "such node description file"),
    (("deploy", "functions/summarize.py", "--node", "node_descriptions/local.yaml"),
     "forge: --node node_descriptions/local.yaml: its node 'local' is not provisioned on this "
     "machine; "
     "`forge provision node_descriptions/local.yaml` starts it"),
    (("deploy", "functions/summarize.py", "--node", "http://127.0.0.1:1"),
     "forge: the node at http://127.0.0.1:1 does not answer (ConnectError: [Errno 111] Connection "
     "refused): is "
     "`forge provision` running there, on that port?"),
])
def test_node_option_means_one_thing_everywhere(home, tmp_path, args, expected):
    job = (
        ()
        if args[0] == "provision"
        else ("--input", "functions/data/summarize.jsonl", "--output", tmp_path / "o.jsonl")
    )
    r = forge_no_engine(*args, *job, env=home)
    assert (
        r.returncode == (2 if "`forge run` provisions its node" in expected else 1)
        and not r.torch_loaded
    )
    assert r.message == expected


def test_run_node_local_is_the_packaged_default(home, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "".join((REPO / "functions/data/summarize.jsonl").read_text().splitlines(True)[:3])
    )
    r = forge(
        "run",
        "functions/summarize.py",
        "--node",
        "local",
        "--input",
        inp,
        "--output",
        tmp_path / "o.jsonl",
        env=home,
    )
    assert r.returncode == 0, r.stderr
    assert "summarize on local: 3 done" in r.stderr
