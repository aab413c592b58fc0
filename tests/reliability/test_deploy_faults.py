"""`forge deploy` against a real `forge provision` process never hangs (issue 13, items 3 and 4): a
record whose prompt cannot be sent fails alone, every batch's calls end whatever the HTTP exchange
does, and a frozen node (SIGSTOP) is noticed within the stall window; after SIGCONT the same command
completes. The freeze tests set the window to 8 s through the environment (FORGE_STALL_WINDOW_S),
for the node and for forge deploy, as an operator sets it; the default is 30 s."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from forge import constants
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import GenerateParams
from forge.node.remote import RemoteNode
from tests.reliability._rel import (
    ECHO,
    NODES,
    assert_complete,
    assert_no_traceback,
    forge,
    forge_argv,
    record_figures,
    start,
    wait_for_growth,
    write_echo_input,
)
from tests.reliability.test_security import Node

SURROGATE_FN = '''
import forge

@forge.function(max_output_tokens=8)
async def sur(record: dict, llm: forge.LLM) -> dict:
    text = "Say \\ud800 now" if record["id"] % 50 == 7 else f"Say: record {record['id']}"
    out = await llm.generate(text, max_tokens=4)
    return {"id": record["id"], "text": out.text}
'''


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path, NODES / "instant.yaml")
    yield n
    if n.proc.poll() is None:
        n.proc.send_signal(signal.SIGCONT)
        n.stop()


def _deploy(n: Node, fn, inp, out, timeout=120, *extra):
    return forge(
        "deploy",
        fn,
        "--node",
        n.local,
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        *extra,
        timeout=timeout,
        env_extra={"FORGE_HOME": str(n.home)},
    )


def test_a_prompt_with_a_lone_surrogate_fails_its_record_and_the_job_ends(node, tmp_path):
    (tmp_path / "sur.py").write_text(SURROGATE_FN)
    inp = write_echo_input(tmp_path / "in.jsonl", 300)
    out = tmp_path / "out.jsonl"
    r = _deploy(node, tmp_path / "sur.py", inp, out, 120)          # hung forever before the fix
    assert_no_traceback(r.stderr)
    assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
    rows = {row["index"]: row for row in map(json.loads, out.read_text().splitlines())}
    bad = sorted(i for i, row in rows.items() if "error" in row)
    assert bad == [i for i in range(300) if i % 50 == 7]
    assert all(
        rows[i]["error"]["type"] == "RequestRejected"
        and "lone surrogate" in rows[i]["error"]["message"]
        for i in bad
    )
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 300)
    record_figures(
        "deploy-lone-surrogate", records=300, error_rows=len(bad), exit_code=r.returncode
    )


def test_remote_calls_that_cannot_travel_fail_alone_over_real_http(node):
    """Past the function's edge (RemoteNode used directly): the item that cannot be encoded fails at
    once, the calls batched with it are answered."""
    async def main():
        rn = RemoteNode(node.local, linger_s=0.05)
        await rn.start()
        try:
            calls = [
                rn.generate(p, GenerateParams(max_tokens=4))
                for p in ("Say one", "Say \udc80", "Say three")
            ]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
        finally:
            await rn.close()

    one, bad, three = asyncio.run(main())
    assert one.output_tokens == 4 and three.output_tokens == 4
    assert isinstance(bad, RequestRejected) and "lone surrogate (U+DC80)" in str(bad), bad


def _calls_end(handler, n_calls=5, **kw) -> list:
    """RemoteNode over an HTTP exchange `handler` scripts (httpx's mock transport: this is the
    reply-handling logic alone); every call must end within 10 s."""
    async def main():
        rn = RemoteNode("http://node.test", linger_s=0.01, **kw)
        rn._client = httpx.AsyncClient(
            base_url="http://node.test", transport=httpx.MockTransport(handler)
        )
        rn.name = "test"
        if hasattr(rn, "_watch"):  # (so this test also runs, and fails, on the code before the fix)
            rn._watchdog = asyncio.ensure_future(rn._watch())
        calls = [rn.generate(f"p{i}", GenerateParams(max_tokens=2)) for i in range(n_calls)]
        try:
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        finally:
            await rn.close()

    return asyncio.run(main())


def _ok(i):
    return {
        "text": "x",
        "output_tokens": 2,
        "input_tokens": 3,
        "finish_reason": "length",
        "card": "cpu0",
    }


@pytest.mark.parametrize(
    "case, reply, expect",
    [
        (
            "not JSON",
            lambda req: httpx.Response(200, content=b"<html>proxy error</html>"),
            "cannot read",
        ),
        ("no results", lambda req: httpx.Response(200, json={"oops": 1}), "cannot read"),
        (
            "results not objects",
            lambda req: httpx.Response(200, json={"results": [1, 2, 3, 4, 5]}),
            "not an object",
        ),
        (
            "short reply",
            lambda req: httpx.Response(200, json={"results": [_ok(0), _ok(1)]}),
            "answered 2 of 5",
        ),
        ("a 500", lambda req: httpx.Response(500, text="boom"), "answered 500"),
        ("a 503 each time", lambda req: httpx.Response(503, text="draining"), "answered 503"),
        ("connection refused", None, "unreachable"),
        ("a bug in the client", "bug", "RuntimeError"),
    ],
)
def test_every_batch_call_ends_whatever_the_reply(case, reply, expect):
    if reply is None:
        def reply(req):
            raise httpx.ConnectError("connection refused", request=req)
    elif reply == "bug":
        def reply(req):
            raise RuntimeError("an unexpected failure inside the transport")
    got = _calls_end(reply)
    errors = [g for g in got if isinstance(g, BaseException)]
    if case == "short reply":
        assert [g.output_tokens for g in got[:2]] == [2, 2] and len(errors) == 3
    else:
        assert len(errors) == 5
    assert all(isinstance(e, ForgeError) and expect in str(e) for e in errors), errors


def test_calls_to_a_node_that_stops_answering_end_within_the_stall_window():
    """Unit level, with a 1 s window: a POST that never returns and probes that time out."""
    async def hang(req):
        await asyncio.sleep(3600)

    t0 = time.monotonic()
    got = _calls_end(hang, stall_window_s=1.0)
    assert time.monotonic() - t0 < 5
    assert all(isinstance(g, NodeDown) and "answered nothing" in str(g) for g in got)


def test_closing_while_the_node_is_frozen_ends_every_call_at_once():
    """Ctrl-C on a job whose node froze: closing the client does not wait out the 600 s read
    timeout."""
    async def main():
        async def hang(req):
            await asyncio.sleep(3600)

        rn = RemoteNode("http://node.test", linger_s=0.01, stall_window_s=600)
        rn._client = httpx.AsyncClient(
            base_url="http://node.test", transport=httpx.MockTransport(hang)
        )
        calls = [
            asyncio.ensure_future(rn.generate(f"p{i}", GenerateParams(max_tokens=2)))
            for i in range(3)
        ]
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        await asyncio.wait_for(rn.close(), 30)
        took = time.monotonic() - t0
        got = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        return took, got

    took, got = asyncio.run(main())
    assert took < 10
    assert all(
        isinstance(g, ForgeError) and "stopped before the request was answered" in str(g)
        for g in got
    ), got


WINDOW_S = 8.0
WINDOW = {"FORGE_STALL_WINDOW_S": f"{WINDOW_S:g}"}

# What a node stopped and woken must not take for a fault of its peers (its own absence is not their
# silence):
NOT_A_FAULT = (
    "has not returned",
    "lost",
    "no engine can work",
    "no token for",
    "wedged",
    "restart",
)


def _freeze_deploy_and_resume(tmp_path, node: Node, pids, *, started, n: int = 20_000) -> dict:
    """Run forge deploy on `node`; once `started(out, proc)` says so, SIGSTOP `pids()` (workers
    first, as a stop of the process group catches them). forge deploy must say the node is silent
    within the stall window (exit 4). The stop lasts past the node's own window; after SIGCONT the
    same command completes on the same node, which must have taken nothing for lost, stalled or
    hung. Returns the figures."""
    inp = write_echo_input(tmp_path / "in.jsonl", n)
    out, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"
    argv = forge_argv(
        "deploy",
        ECHO,
        "--node",
        node.local,
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
    )
    proc = start(
        argv,
        stderr_path=tmp_path / "deploy.err",
        env_extra={"FORGE_HOME": str(node.home), **WINDOW},
    )
    stopped: list[int] = []
    try:
        assert started(out, proc), (tmp_path / "deploy.err").read_text()
        stopped = pids()
        for pid in reversed(stopped):
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            rc = proc.wait(timeout=WINDOW_S + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"forge deploy still waiting {WINDOW_S + 30:g} s after SIGSTOP")
        noticed_s = time.monotonic() - frozen_at
        time.sleep(max(0.0, WINDOW_S + 5 - noticed_s))     # frozen past the node's own window
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    frozen_s = time.monotonic() - frozen_at
    err = (tmp_path / "deploy.err").read_text()
    assert_no_traceback(err)
    assert rc == constants.EXIT_INCOMPLETE and "has answered nothing for" in err, (rc, err)
    assert "run the same command again" in err, err
    assert noticed_s < WINDOW_S + 15
    assert frozen_s > WINDOW_S + 2
    r = forge(*argv[3:], timeout=300, env_extra={"FORGE_HOME": str(node.home), **WINDOW})
    # complete (echo fails a few on purpose)
    assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
    assert_complete(out, ledger, n)
    health = httpx.get(node.local + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["healthy_cards"] == ["cpu0"], health
    (card,) = httpx.get(node.local + "/v1/stats", timeout=10).json()["engines"]
    assert card["stalls"] == 0 and card["requests_requeued"] == 0, card
    node_log = node.err.read_text()
    assert not [w for w in NOT_A_FAULT if w in node_log], node_log
    return dict(
        noticed_s=round(noticed_s, 1),
        stall_window_s=WINDOW_S,
        exit_code=rc,
        frozen_s=round(frozen_s, 1),
        message=err.strip().splitlines()[-1],
        same_node_completed=True,
        node_stalls=card["stalls"],
        node_requeued=card["requests_requeued"],
    )


def test_deploy_notices_a_frozen_node_within_the_stall_window_and_resumes(tmp_path):
    """SIGSTOP of the provisioned node (its card worker runs on) mid-job. Woken, the node finds its
    worker's answers waiting: its calls to the worker are timed on the time it was running, so the
    worker is not taken for lost (it was, and restarted, when they were timed on the wall clock)."""
    node = Node(tmp_path, NODES / "paced.yaml", env_extra=WINDOW)
    try:
        # 8,000 paced records: ~6 s of work, frozen at the first rows
        figures = _freeze_deploy_and_resume(
            tmp_path, node, lambda: [node.proc.pid], n=8_000,
            started=lambda out, proc: wait_for_growth(out, proc, beyond=2000, timeout_s=60))
        record_figures("deploy_sigstop", **figures)
    finally:
        node.stop()


def test_a_node_stopped_with_its_workers_does_not_take_the_stop_for_a_stall(tmp_path):
    """SIGSTOP of the node and its card worker (as Ctrl-Z on their process group), while the engine
    is silent (a 16 s freeze, past the 8 s stall window, starts after 300 results; the stop lasts 13
    s of it). Woken, the worker's watchdog counts only the time it was running: about 3 s of
    silence, not a stall (it counted one when it timed the silence on the wall clock), and the same
    job completes once the engine recovers."""
    from tests.node.test_worker_lifecycle import worker_pids

    node = Node(tmp_path, NODES / "freeze-16s.yaml", env_extra=WINDOW)

    # the engine has handed out its 300 results: the freeze has begun
    def frozen(out, proc) -> bool:
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            (card,) = httpx.get(node.local + "/v1/stats", timeout=10).json()["engines"]
            if card["requests_ok"] >= 300:
                return True
            time.sleep(0.05)
        return False

    try:
        workers = worker_pids(node.proc.pid)
        assert len(workers) == 1, workers
        figures = _freeze_deploy_and_resume(
            tmp_path, node, lambda: [node.proc.pid] + workers, started=frozen
        )
        record_figures("deploy_sigstop_group", engine_freeze_s=16, **figures)
    finally:
        node.stop()


def test_deploy_reports_the_retries_its_ledger_holds(tmp_path):
    """Killed mid-run, the records in flight are invoked again on resume: the summary says how many
    records were invoked more than once, as the ledger does (it said 0 retried: it counted engine
    requeues, none remote)."""
    import re

    from tests.reliability._rel import kill9, ledger_summary

    node = Node(tmp_path, NODES / "paced.yaml")
    try:
        inp = write_echo_input(tmp_path / "in.jsonl", 5000)
        out, ledger = tmp_path / "out.jsonl", tmp_path / "out.jsonl.ledger.sqlite"
        argv = forge_argv(
            "deploy",
            ECHO,
            "--node",
            node.local,
            "--input",
            inp,
            "--output",
            out,
            "--progress",
            "off",
            "--no-report",
        )
        proc = start(
            argv, stderr_path=tmp_path / "first.err", env_extra={"FORGE_HOME": str(node.home)}
        )
        assert wait_for_growth(out, proc, beyond=2000, timeout_s=60)
        assert kill9(proc)
        r = forge(*argv[3:], timeout=300, env_extra={"FORGE_HOME": str(node.home)})
        assert r.returncode == constants.EXIT_ERROR_ROWS, r.stderr
        assert_complete(out, ledger, 5000)
        said = int(re.search(r"(\d+) retried", r.stderr).group(1))
        assert said == ledger_summary(ledger)["retried"] > 0, r.stderr
        record_figures("deploy-kill9-retried", records=5000, summary_retried=said,
                       ledger_retried=ledger_summary(ledger)["retried"])
    finally:
        node.stop()
