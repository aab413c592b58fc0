"""Card workers' lives, with real processes and signals: every card loads in its own fresh process
(a two-card node of the tiny model comes up healthy start after start), a worker dies with its node
(kill -9 of the node; its end of the socket closing), a worker killed mid-job is started again and
every record settles exactly once, restarts are bounded, and SIGTERM to a node drains and stops
every worker cleanly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from forge.constants import EXIT_ERROR_ROWS, EXIT_INCOMPLETE
from tests.forge_cli import WORKER_MARK
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    forge_argv,
    kill9,
    read_rows,
    run_argv,
    start,
    wait_for_growth,
    write_echo_input,
)

FIX = Path(__file__).parent / "fixtures"
TWO_TINY = FIX / "two-tiny.yaml"


def worker_pids(node_pid: int) -> list[int]:
    """The card workers a node process started (children running forge.host:
    forge/link/worker_argv.py)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == node_pid and any(WORKER_MARK.encode() in arg for arg in cmd):
            out.append(int(entry))
    return sorted(out)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(cond, timeout_s: float, step_s: float = 0.05) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step_s)
    return cond()


def provision(tmp: Path, node: Path, name: str) -> tuple[subprocess.Popen, str, Path]:
    ready, err = tmp / f"{name}.ready", tmp / f"{name}.err"
    proc = start(
        forge_argv("provision", node, "--port", "0", "--metrics-port", "0", "--ready-file", ready),
        stderr_path=err,
    )
    assert wait_until(
        lambda: ready.exists() and ready.read_text().strip() or proc.poll() is not None, 240
    ), err.read_text()
    assert proc.poll() is None, err.read_text()
    return proc, ready.read_text().strip(), err


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_a_two_card_node_comes_up_healthy_start_after_start_and_drains_on_sigterm(tmp_path):
    """Three starts, each in a fresh node process whose two cards load at the same time in their own
    workers (in one process they raced: a lazy import, torch's default dtype). Each start serves on
    both cards; SIGTERM drains the node, every worker stops cleanly and none is left."""
    import httpx

    for i in range(3):
        proc, url, err = provision(tmp_path, TWO_TINY, f"start{i}")
        try:
            health = httpx.get(url + "/health", timeout=10).json()
            assert health["status"] == "ok" and health["healthy_cards"] == ["cpu0", "cpu1"], (
                i,
                health,
            )
            cards = httpx.get(url + "/v1/node", timeout=10).json()["cards"]
            pids = [c["pid"] for c in cards]
            assert (
                sorted(pids) == worker_pids(proc.pid)
                and len(set(pids)) == 2
                and proc.pid not in pids
            )
            batch = [
                {"prompt": f"Alice was beginning to get very tired {j}", "max_tokens": 8}
                for j in range(96)
            ]
            got = httpx.post(url + "/v1/generate", json={"requests": batch}, timeout=120).json()[
                "results"
            ]
            assert [
                r for r in got if "error" in r or r["finish_reason"] not in ("eos", "length")
            ] == []
            assert {r["card"] for r in got} == {"cpu0", "cpu1"}, i          # both engines answered
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=120)
        text = err.read_text()
        assert rc == 0 and "stopped (clean)" in text, text
        assert "did not stop cleanly" not in text and "killed" not in text, text
        assert not any(running(p) for p in pids), (i, pids)  # no worker outlived its node
        assert_no_traceback(text)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(300)
def test_workers_die_with_a_node_killed_with_sigkill(tmp_path):
    proc, url, err = provision(tmp_path, NODES / "paced.yaml", "node")
    pids = worker_pids(proc.pid)
    assert len(pids) == 1 and running(pids[0])
    kill9(proc)  # no drain, no stop through the link: the worker must notice by itself
    assert wait_until(lambda: not running(pids[0]), 10), "the worker outlived its node"


@pytest.mark.timeout(120)
def test_a_worker_whose_node_closes_the_link_without_stopping_it_exits(tmp_path):
    """The portable half of the lifeline: end of file on the worker's socket, with its parent still
    alive."""
    import asyncio

    from forge.config.load import load_node
    from forge.host.lifeline import EXIT_ORPHANED
    from forge.link.process import ProcessTransport

    loaded = load_node(NODES / "instant.yaml")

    async def main() -> int:
        t = ProcessTransport(loaded.plans[0], node="instant")
        await t.start()
        await t.channel.close()               # the node's end goes away; no "stop" was sent
        t.channel = None
        deadline = time.monotonic() + 10
        while t.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        rc = t.proc.poll()
        await t.close(5.0)
        return rc

    assert asyncio.run(main()) == EXIT_ORPHANED


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_a_worker_killed_mid_job_is_restarted_and_every_record_settles_once(tmp_path):
    """`forge run` on the real tiny engine; its card's worker is SIGKILLed while requests are in
    flight. The requests go back to the broker, the card comes back in a new worker, the job
    finishes: every input line in the output exactly once, each record's function run once, the
    requeued requests counted."""
    n = 600
    inp = write_echo_input(tmp_path / "in.jsonl", n)
    out, log, err = tmp_path / "out.jsonl", tmp_path / "invocations.log", tmp_path / "run.err"
    argv = run_argv(ECHO, inp, out, None)
    argv.remove("--no-report")
    proc = start(
        argv,
        stderr_path=err,
        env_extra={"FORGE_TEST_INVOCATIONS": str(log), "FORGE_TEST_MAX_TOKENS": "8"},
    )
    try:
        assert wait_for_growth(out, proc, beyond=2000, timeout_s=240), err.read_text()
        (victim,) = worker_pids(proc.pid)
        os.kill(victim, signal.SIGKILL)
        rows_at_kill = len(read_rows(out))
        rc = proc.wait(timeout=400)
    finally:
        kill9(proc)
    text = err.read_text()
    assert rc == EXIT_ERROR_ROWS, text          # complete; echo fails id % 97 == 13 on purpose
    assert_no_traceback(text)
    assert "card cpu0: worker lost" in text and "(restart 1 of 3)" in text, text
    assert rows_at_kill < n
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), n)
    invoked = [int(line.split()[1]) for line in log.read_text().splitlines()]
    assert sorted(invoked) == list(range(n))                       # no record's function ran twice
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    # what the dead worker held went back
    assert report["summary"]["requeued"] >= 1, report["summary"]
    assert report["summary"]["retried"] == 0  # ... as requests: no function ran again


@pytest.mark.timeout(300)
def test_restarts_are_bounded_then_the_card_is_failed(tmp_path):
    """Kill every new worker: after three restarts the card is given up, the node is down, the job
    stops with one line naming why, and what it did not finish stays in the ledger for a rerun."""
    n = 20_000
    inp = write_echo_input(tmp_path / "in.jsonl", n)
    out, err = tmp_path / "out.jsonl", tmp_path / "run.err"
    proc = start(run_argv(ECHO, inp, out, NODES / "paced.yaml"), stderr_path=err)
    killed: set[int] = set()
    try:
        assert wait_for_growth(out, proc, beyond=0, timeout_s=120), err.read_text()
        while proc.poll() is None and len(killed) < 4:
            for pid in worker_pids(proc.pid):
                if pid not in killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.05)
        rc = proc.wait(timeout=120)
    finally:
        kill9(proc)
    text = err.read_text()
    assert len(killed) == 4 and rc == EXIT_INCOMPLETE, text
    assert_no_traceback(text)
    last = text.strip().splitlines()[-1]
    assert (
        last.startswith("forge: stopped: node paced: no engine can work (cpu0: ")
        and "3 restart(s) spent" in last
    ), text
    assert "run the same command again to resume" in last
    assert len(read_rows(out)) < n
