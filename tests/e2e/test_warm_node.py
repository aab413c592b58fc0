"""`forge run` on a node already up (forge/machine/warm_node.py): the same node, provisioned from
this checkout, runs the job and loads nothing new; a changed description or environment, a node that
does not answer, refuses the run's token or runs its cards in its own process each make the run
provision its own and say why, as --fresh-node does without a word. Real processes, real HTTP, the
real engine."""
import contextlib
import os
import re
import signal
import time

import httpx
import pytest

from tests.e2e.helpers import REPO, forge, read_output
from tests.forge_cli import provisioned

pytestmark = pytest.mark.engine

OK = re.compile(r'^forge_requests_total\{[^}]*outcome="ok"[^}]*\} ([0-9.e+]+)$', re.M)


def served(metrics_url: str, expect: float = -1.0) -> float:
    """Requests the node's cards have answered so far, from its Prometheus /metrics: the node
    samples its cards' stats every 0.5 s (forge/node/provision.py), so read until `expect` shows, or
    for 3 s."""
    deadline = time.monotonic() + 3
    while True:
        n = sum(float(v) for v in OK.findall(httpx.get(metrics_url, timeout=10).text))
        if n == expect or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


@contextlib.contextmanager
def warm_node(tmp_path, *extra, env=None):
    with provisioned(tmp_path / "home", *extra, env=env) as node:
        yield {
            **node,
            "home": {"FORGE_HOME": str(tmp_path / "home")},
            "metrics": node["entry"]["metrics_url"],
        }


@pytest.fixture
def warm(tmp_path):
    with warm_node(tmp_path) as node:
        yield node


def _run(tmp_path, env, name, *extra):
    inp = tmp_path / "in.jsonl"
    if not inp.exists():
        inp.write_text(
            "".join((REPO / "functions/data/summarize.jsonl").read_text().splitlines(True)[:12])
        )
    out = tmp_path / f"{name}.jsonl"
    r = forge(
        "run",
        "functions/summarize.py",
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        *extra,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert len(read_output(out)) == 12 and "summarize on local: 12 done" in r.stderr
    return r


def test_a_run_uses_the_same_node_already_up_and_fresh_node_does_not(warm, tmp_path):
    pid = warm["proc"].pid
    before = served(warm["metrics"])
    used = _run(tmp_path, warm["home"], "warm")  # the packaged `local`: the same node as the file's
    assert f"forge: using node 'local', already up (pid {pid}); --fresh-node provisions one in this process" \
        in used.stderr
    assert served(warm["metrics"], before + 12) == before + 12
    fn = tmp_path / "ids.py"  # what a function reads of a generation is the same on the warm node
    fn.write_text("import forge\n\n@forge.function()\nasync def ids(record, llm):\n"
                  "    out = await llm.generate(record['text'], max_tokens=8, stop=['.'])\n"
                  "    return [list(out.token_ids), out.output_tokens, out.finish_reason]\n")
    r = forge(
        "run",
        fn,
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        tmp_path / "ids.jsonl",
        "--progress",
        "off",
        env=warm["home"],
    )
    assert r.returncode == 0 and "already up" in r.stderr, r.stderr
    rows = [row["result"] for row in read_output(tmp_path / "ids.jsonl")]
    assert all(len(ids) == n for ids, n, _ in rows) and sum(n for _, n, _ in rows) > 12, rows
    assert served(warm["metrics"], before + 24) == before + 24
    before += 24

    fresh = _run(tmp_path, warm["home"], "fresh", "--fresh-node")
    assert "already up" not in fresh.stderr and "note:" not in fresh.stderr
    assert served(warm["metrics"]) == before                # the warm node answered nothing of it

    # a node shaped by the flag
    thread = _run(tmp_path, warm["home"], "thread", "--card-transport", "thread")
    assert "already up" not in thread.stderr and served(warm["metrics"]) == before


def test_a_changed_description_or_a_node_that_does_not_answer_is_not_used(warm, tmp_path):
    pid = warm["proc"].pid
    before = served(warm["metrics"])
    changed = tmp_path / "local.yaml"
    changed.write_text(
        (REPO / "node_descriptions/local.yaml")
        .read_text()
        .replace(
            "../forge/embedded/tiny-llama-cpu.yaml",
            str(REPO / "forge/embedded/tiny-llama-cpu.yaml"),
        )
        .replace("memory_gib: 4 ", "memory_gib: 3 ")
    )
    other = _run(tmp_path, warm["home"], "changed", "--node", changed)
    changed_line = (f"forge: note: node 'local' is up (pid {pid}) from another description or "
                    "contracts, other model "
                    "files, other forge code or other FORGE_/engine environment variables: "
                    "provisioning one in this "
                    "process")
    assert changed_line in other.stderr
    # the node reads 30 s
    window = _run(tmp_path, {**warm["home"], "FORGE_STALL_WINDOW_S": "600"}, "window")
    assert changed_line in window.stderr
    assert served(warm["metrics"]) == before

    os.kill(pid, signal.SIGSTOP)  # alive, holding its name, answering nothing
    try:
        stuck = _run(tmp_path, warm["home"], "stuck")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (
        f"forge: note: node 'local' is up (pid {pid}) but does not answer at http://127.0.0.1:"
        in stuck.stderr
    )
    assert "provisioning one in this process" in stuck.stderr and served(warm["metrics"]) == before


def test_a_node_that_refuses_the_runs_token_or_runs_its_cards_in_its_process_is_not_used(tmp_path):
    with warm_node(tmp_path / "a", env={"FORGE_TOKEN": "s3cret"}) as node:
        refused = _run(tmp_path / "a", node["home"], "no-token")
        assert (f"forge: note: node 'local' is up (pid {node['proc'].pid}) but refuses this run's "
                "token (its "
                "control.token_env): provisioning one in this process") in refused.stderr
        taken = _run(tmp_path / "a", {**node["home"], "FORGE_TOKEN": "s3cret"}, "token")
        assert "forge: using node 'local', already up" in taken.stderr
        assert served(node["metrics"], 12) == 12
    with warm_node(tmp_path / "b", "--card-transport", "thread") as node:
        inproc = _run(tmp_path / "b", node["home"], "thread-node")
        assert (f"forge: note: node 'local' is up (pid {node['proc'].pid}) with its cards in its "
                "own process "
                "(--card-transport thread): provisioning one in this process") in inproc.stderr
        assert served(node["metrics"]) == 0
