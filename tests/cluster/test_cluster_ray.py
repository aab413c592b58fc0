"""forge on a real Ray cluster of three fake nodes on this machine, each running the real tiny
engine on CPU.

a: one card of tier tiny-long (prompts up to 384 tokens); b, c: one card each of tier tiny-short (up
to 64). Each node is a raylet plus the real node agent (`forge provision NODE.yaml --cluster ...`,
harness.py). The tests share one cluster and run in order: status, the agent's progress lines while
its engine loads, placement, a job across nodes, a job that loses node c midway, c provisioned again
and a second job, a node d whose engine crashes during a job (Ray rebuilds it on its card), c's
agent stopped (SIGTERM) midway through a job, and an agent's death (SIGKILL) taking its engine with
it, and a node e whose card names two cores: its engine actor runs two threads."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.installed import skip_module_unless_installed

# ray imported where used: collection stays light
skip_module_unless_installed("ray", "torch", "transformers")

from forge.cluster.agent import PROGRESS_EVERY_S  # noqa: E402
from forge.cluster.names import NAMESPACE  # noqa: E402
from forge.host.protocol import Hello  # noqa: E402
from tests.cluster.harness import FIXTURES, REPO, LocalCluster  # noqa: E402
from tests.forge_cli import invoke  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(240)]
TAG = str(FIXTURES / "functions" / "tag.py")
LONG = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do. " * 5


def write_records(path: Path, n_short: int, n_long: int = 0) -> Path:
    with open(path, "w") as f:
        for i in range(n_short):
            f.write(
                json.dumps({"id": f"s{i}", "text": f"record {i}: the cat sat on the mat."}) + "\n"
            )
        for i in range(n_long):
            f.write(json.dumps({"id": f"l{i}", "text": f"{LONG}record {i}"}) + "\n")
    return path


def read_output(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    indices = Counter(r["index"] for r in rows)
    assert not [i for i, n in indices.items() if n > 1], "a record was written twice"
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r][:3]
    return rows


def engine_info(name: str) -> Hello:
    import ray

    return ray.get(
        ray.get_actor(f"engine:{name}/cpu0", namespace=NAMESPACE).hello.remote(), timeout=30
    )


@pytest.fixture(scope="module")
def lc(tmp_path_factory):
    import ray

    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        for n in "abc":
            c.add(FIXTURES / "nodes" / f"{n}.yaml")
        c.wait_ready()
        ray.init(address=c.address, namespace=NAMESPACE, log_to_driver=False)
        yield c
    finally:
        c.shutdown()


def test_status_lists_nodes_cards_tiers_and_health(lc):
    rc, out, err = invoke("status", "--cluster", lc.address, "--json")
    assert rc == 0, err
    rows = {r["node"]: r for r in json.loads(out)}
    assert set(rows) == {"a", "b", "c"}
    tiers = {n: [c["tier"] for c in r["cards"]] for n, r in rows.items()}
    assert tiers == {"a": ["tiny-long"], "b": ["tiny-short"], "c": ["tiny-short"]}
    assert all(r["state"] == "up" and r["cards"][0]["healthy"] for r in rows.values())


def test_provisioning_says_what_it_loads_until_each_engine_is_up(lc):
    lines = lc.nodes["a"].log.read_text().splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    loading = first("node a: loading 1 engine(s): cpu0 (tiny-long, transformers)")
    up = first("node a: card cpu0 (tiny-long) up in")
    assert loading < up < first("node a joined the Ray cluster"), lines
    load_s = float(re.search(r"up in ([0-9.]+) s", lines[up]).group(1))
    ticks = [line for line in lines[loading:up] if "node a: still loading cpu0" in line]
    # one line every PROGRESS_EVERY_S
    assert len(ticks) >= int(load_s // PROGRESS_EVERY_S) - 1, lines


def test_engines_are_placed_by_tier_and_hold_their_card(lc):
    import ray

    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    for name in "abc":
        info = engine_info(name)
        assert info.ray_node_id == lc.nodes[name].info()["ray_node_id"]
        assert nodes[info.ray_node_id]["Resources"][f"forge_tier:{info.tier}"] == 1.0
        assert info.guard["pdeathsig"] and info.guard["watches_agent"]
    free = ray.available_resources()
    assert free.get("forge_tier:tiny-long", 0) == 0 and free.get("forge_tier:tiny-short", 0) == 0
    assert free.get("forge_card:cpu", 0) == 0  # every card is held by its engine for life


def test_job_spreads_across_nodes_and_long_prompts_go_to_the_long_tier(lc, tmp_path):
    # a backlog: every engine takes work
    data = write_records(tmp_path / "in.jsonl", n_short=240, n_long=12)
    out = tmp_path / "out.jsonl"
    rc, _, err = invoke(
        "deploy",
        TAG,
        "--cluster",
        lc.address,
        "--input",
        str(data),
        "--output",
        str(out),
        "--progress",
        "off",
    )
    assert rc == 0, err
    rows = read_output(out)
    assert len(rows) == 252
    by_id = {r["result"]["id"]: r["result"] for r in rows}
    longs = [by_id[f"l{i}"] for i in range(12)]
    assert all(r["card"] == "a/cpu0" and r["input_tokens"] > 64 for r in longs)
    assert {r["card"] for r in by_id.values()} == {"a/cpu0", "b/cpu0", "c/cpu0"}, err
    report = json.loads((tmp_path / "out.jsonl.report.json").read_text())
    per_card = {(c["node"], c["card"], c["tier"]): c["requests"]["ok"] for c in report["cards"]}
    assert set(per_card) == {
        ("a", "cpu0", "tiny-long"),
        ("b", "cpu0", "tiny-short"),
        ("c", "cpu0", "tiny-short"),
    }
    assert sum(per_card.values()) == 252                    # the job's own counts, per node


def test_losing_a_node_midway_loses_nothing_and_writes_nothing_twice(lc, tmp_path):
    n = 900  # long enough that c is lost with work in hand
    data = write_records(tmp_path / "in.jsonl", n_short=n)
    out = tmp_path / "out.jsonl"
    victim_pid = engine_info("c").pid
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "deploy",
            TAG,
            "--cluster",
            lc.address,
            "--input",
            str(data),
            "--output",
            str(out),
            "--progress",
            "off",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 90
    while not (out.exists() and len(out.read_text().splitlines()) >= 100):
        assert job.poll() is None, job.stdout.read()
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.05)
    lc.lose("c")                                             # raylet and agent of node c: SIGKILL
    log, _ = job.communicate(timeout=150)
    assert job.returncode == 0, log
    rows = read_output(out)
    assert sorted(r["index"] for r in rows) == list(range(n)), log
    cards = Counter(r["result"]["card"] for r in rows)
    assert cards["c/cpu0"] > 0 and cards["a/cpu0"] + cards["b/cpu0"] > 0, cards
    assert "engine c/cpu0 lost" in log and "0 failed" in log, log
    summary = json.loads((tmp_path / "out.jsonl.report.json").read_text())["summary"]
    assert summary["records_done"] == n and summary["requeued"] > 0
    for _ in range(100):  # its engine process did not outlive the node
        if not os.path.exists(f"/proc/{victim_pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{victim_pid}"), "engine of the lost node still running"


def test_a_reprovisioned_node_serves_the_next_job(lc, tmp_path):
    lc.add(FIXTURES / "nodes" / "c.yaml", wait=True)
    data = write_records(tmp_path / "in.jsonl", n_short=400)
    out = tmp_path / "out.jsonl"
    rc, _, err = invoke(
        "deploy",
        TAG,
        "--cluster",
        lc.address,
        "--input",
        str(data),
        "--output",
        str(out),
        "--progress",
        "off",
    )
    assert rc == 0, err
    rows = read_output(out)
    assert len(rows) == 400
    assert {r["result"]["card"] for r in rows} == {"a/cpu0", "b/cpu0", "c/cpu0"}, err


def test_a_crashing_engine_is_rebuilt_on_its_card_and_the_job_loses_nothing(lc, tmp_path):
    import ray

    lc.add(FIXTURES / "nodes" / "d.yaml", wait=True)  # its engine (no model) fails after 40 results
    first = engine_info("d").incarnation
    data = write_records(tmp_path / "in.jsonl", n_short=600)
    out = tmp_path / "out.jsonl"
    rc, _, err = invoke(
        "deploy",
        TAG,
        "--cluster",
        lc.address,
        "--input",
        str(data),
        "--output",
        str(out),
        "--progress",
        "off",
    )
    assert rc == 0, err
    rows = read_output(out)
    assert sorted(r["index"] for r in rows) == list(range(600))
    assert Counter(r["result"]["card"] for r in rows)["d/cpu0"] >= 40
    summary = json.loads((tmp_path / "out.jsonl.report.json").read_text())["summary"]
    assert summary["requeued"] > 0, err  # what the failed engine held went elsewhere
    for _ in range(100):                 # Ray rebuilt it on its card: a new incarnation
        try:
            if engine_info("d").incarnation != first:
                break
        except (ray.exceptions.RayError, ValueError):
            pass
        time.sleep(0.1)
    else:
        pytest.fail("the crashed engine was not rebuilt")


def test_an_agent_stopped_midway_drains_its_node_and_the_job_loses_nothing(lc, tmp_path):
    n = 900
    data = write_records(tmp_path / "in.jsonl", n_short=n)
    out = tmp_path / "out.jsonl"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "deploy",
            TAG,
            "--cluster",
            lc.address,
            "--input",
            str(data),
            "--output",
            str(out),
            "--progress",
            "off",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 90
    while not (out.exists() and len(out.read_text().splitlines()) >= 100):
        assert job.poll() is None, job.stdout.read()
        assert time.monotonic() < deadline, "the job never got going"
        time.sleep(0.05)
    agent = lc.nodes["c"].agent
    agent.send_signal(signal.SIGTERM)                        # c leaves the cluster in good order
    assert agent.wait(60) == 0, lc.nodes["c"].log.read_text()[-2000:]
    log, _ = job.communicate(timeout=150)
    assert job.returncode == 0, log
    rows = read_output(out)
    assert sorted(r["index"] for r in rows) == list(range(n)), log
    assert "leaving the cluster" in lc.nodes["c"].log.read_text()


def test_engines_do_not_outlive_their_agent(lc):
    pid = engine_info("b").pid
    lc.nodes["b"].agent.kill()
    lc.nodes["b"].agent.wait(10)
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "engine outlived its agent"
    rc, out, err = invoke("status", "--cluster", lc.address, "--json")
    rows = {r["node"]: r for r in json.loads(out)}
    assert rows["b"]["state"].startswith("no agent") and rows["a"]["state"] == "up"


def test_an_engine_actor_runs_the_threads_its_card_has(lc):
    """Ray starts an actor with OMP_NUM_THREADS=<its num_cpus>; e's card names cores 0 and 1 on a
    Ray node of one CPU: its engine runs 2 threads on those cores, and its agent says Ray counts
    only one."""
    import ray

    node = lc.add(FIXTURES / "nodes" / "e.yaml", wait=True, num_cpus=1)
    got = ray.get(ray.get_actor("engine:e/cpu0", namespace=NAMESPACE).threads.remote(), timeout=30)
    assert (got["wanted"], got["threads"], got["problems"]) == (2, 2, []), got
    assert got["now"] == {"omp_num_threads": "2", "torch_threads": 2, "cores": [0, 1]}, got
    log = node.log.read_text()
    assert "card cpu0 (instant-bench) up in" in log and ", 2 thread(s)" in log, log
    assert (
        "warning: card cpu0: its Ray node has 1 CPU(s)" in log and "reserves 1 of its 2" in log
    ), log
