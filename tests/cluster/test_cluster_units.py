"""forge.cluster without Ray: names and resources, the auth rules, the wire format, and the engine
actor (EngineActor: the engine host with the real instant engine) driven by a job's EngineLink
through the Ray transport over an in-process handle. The in-process handle stands in for Ray's actor
handle only; loss is simulated by making its calls fail."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from forge.broker import Broker, BrokerCore, BrokerRequest
from forge.cluster import actor, connect
from forge.cluster.actor import EngineActor, RayTransport
from forge.cluster.names import engine_actor_name, engine_resources, node_resources, slug
from forge.host.wire import from_wire
from forge.link.wire import to_wire
from forge.config.load import load_node
from forge.engines.interface import Sampling
from forge.errors import UsageError
from forge.link.link import EngineLink
from forge.requests import RequestOptions

FIX = Path(__file__).parent / "fixtures"
INSTANT_NODE = FIX / "instant" / "nodes" / "i1.yaml"


# ----------------------------------------------------------------------------- names, resources
def test_node_resources_name_cards_and_tiers():
    loaded = load_node(FIX / "nodes" / "b.yaml")
    assert node_resources(loaded) == {
        "forge_node:b": 1.0,
        "forge_card:cpu": 1.0,
        "forge_tier:tiny-short": 1.0,
    }
    assert engine_resources(loaded.plans[0]) == {
        "forge_card:cpu": 1.0,
        "forge_tier:tiny-short": 1.0,
    }
    assert engine_actor_name("b", "cpu0") == "engine:b/cpu0"
    assert slug("NVIDIA GeForce RTX 5090") == "nvidia-geforce-rtx-5090"


# ----------------------------------------------------------------------------- auth and environment
@pytest.fixture
def ray_env(monkeypatch, tmp_path):
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


def test_auth_mode_must_be_explicit(ray_env):
    with pytest.raises(UsageError, match="RAY_AUTH_MODE explicitly"):
        connect.check_environment("127.0.0.1:6379")


def test_disabled_auth_only_on_loopback(ray_env):
    ray_env.setenv("RAY_AUTH_MODE", "disabled")
    assert connect.check_environment("127.0.0.1:6379") == "disabled"
    import os

    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    with pytest.raises(UsageError, match="beyond loopback"):
        connect.check_environment("10.0.0.5:6379")


def test_token_auth_needs_a_token(ray_env, tmp_path):
    ray_env.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(UsageError, match="no token found"):
        connect.check_environment("10.0.0.5:6379")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc\n")
    assert connect.check_environment("10.0.0.5:6379") == "token"


def test_an_unreachable_head_is_named_at_once():
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert connect.unreachable(f"127.0.0.1:{port}") is None
    assert connect.unreachable(f"127.0.0.1:{port}") == "Connection refused"
    assert connect.unreachable("auto") is None and connect.unreachable("ray://h:10001") is None


def test_address_host():
    assert connect.address_host("10.0.0.5:6379") == "10.0.0.5"
    assert connect.address_host("ray://h.example:10001") == "h.example"
    assert connect.address_host("[::1]:6379") == "::1"


# ----------------------------------------------------------------------------- wire
def test_wire_round_trip_keeps_identity_options_and_age():
    opts = RequestOptions(sampling=Sampling(temperature=0.5), deadline_s=3.0)
    req = BrokerRequest(
        request_id="r1",
        prompts={"k": (1, 2, 3), "other": (9,)},
        max_new_tokens=4,
        payload=opts,
        priority=2,
        attempt=1,
        enqueued_at=time.monotonic() - 2.0,
    )
    item = to_wire(req, "k", time.monotonic())
    back = from_wire(item, "sess", "mine", time.monotonic())
    assert back.prompt == (1, 2, 3) and back.max_new_tokens == 4 and back.priority == 2
    assert back.key == ("sess", "r1", 1) and (back.key.session, back.key.rid, back.key.attempt) == (
        "sess",
        "r1",
        1,
    )
    assert back.options.sampling.temperature == 0.5 and back.options.deadline_s == 3.0
    assert 1.9 < time.monotonic() - back.enqueued_at < 3.0
    assert (
        to_wire(
            BrokerRequest(request_id="x", prompts={"k": (1,)}, max_new_tokens=1), "k", 0.0
        ).options
        is None
    )


# ----------------------------------------------------------------------------- the engine actor's
# body, and a job's link to it
class InProcessHandle:
    """Ray's actor-handle calling convention (`handle.method.remote(...)` -> awaitable) over a local
    object."""

    def __init__(self, target):
        self._target = target
        self.broken = False

    def __getattr__(self, name):
        method = getattr(self._target, name)
        handle = self

        class Remote:
            @staticmethod
            def remote(*args):
                async def call():
                    if handle.broken:
                        raise ConnectionError("actor unavailable")
                    return await method(*args)
                return asyncio.ensure_future(call())
        return Remote()


def make_host() -> EngineActor:
    return EngineActor(str(INSTANT_NODE), 0, {"guard": False, "tier": "instant-bench"})


def test_host_runs_batches_and_drops_ended_sessions():
    async def main():
        host = make_host()
        info = await host.hello()
        assert info.engine_id == "i1/cpu0" and info.geometry.max_batch_size == 512
        key = host.tokenizer_key
        ids = (await host.encode(["hello there"]))[0]
        reqs = [
            BrokerRequest(request_id=f"r{i}", prompts={key: tuple(ids)}, max_new_tokens=4)
            for i in range(20)
        ]
        assert await host.submit("s1", [to_wire(r, key, time.monotonic()) for r in reqs]) == 20
        got = []
        while len(got) < 20:
            got += (await host.collect("s1", 1.0)).results
        assert sorted(r.rid for r in got) == sorted(f"r{i}" for i in range(20))
        assert all(r.finish_reason == "length" and len(r.output_ids) == 4 for r in got)
        await host.end_session("s1")
        ended = await host.collect("s1", 0.01)
        assert ended.ended and ended.incarnation == host.incarnation and ended.results == []
        await host.stop()

    asyncio.run(main())


def test_link_requeues_a_lost_engines_work_and_settles_each_request_once(monkeypatch):
    monkeypatch.setattr(actor, "REATTACH_INTERVAL_S", 0.05)

    async def main():
        host = make_host()
        info = await host.hello()
        handle = InProcessHandle(host)
        geom = info.geometry
        broker = Broker(BrokerCore([geom], node="test"))
        settled: dict[str, int] = {}
        done: dict[str, asyncio.Future] = {}

        def settle(req, eid, res):
            settled[req.request_id] = settled.get(req.request_id, 0) + 1
            done[req.request_id].set_result(res)

        link = EngineLink(
            RayTransport("engine:i1/cpu0", handle),
            info,
            broker=broker,
            rid_prefix="j",
            settle=settle,
            fail=lambda req, msg: done[req.request_id].set_exception(RuntimeError(msg)),
        )
        link.start()
        key = host.tokenizer_key
        ids = tuple((await host.encode(["a prompt"]))[0])
        reqs = [
            BrokerRequest(request_id=f"r{i}", prompts={key: ids}, max_new_tokens=8)
            for i in range(200)
        ]
        for r in reqs:
            done[r.request_id] = asyncio.get_running_loop().create_future()
            await broker.put(r)
        handle.broken = True                      # the engine becomes unreachable mid-job
        await asyncio.sleep(0.3)
        assert link.state == "down"
        handle.broken = False                     # ... and answers again: the link takes it back
        results = await asyncio.wait_for(asyncio.gather(*done.values()), 20)
        assert len(results) == 200 and all(n == 1 for n in settled.values()) and len(settled) == 200
        assert link.state == "up" and link.lost_requeued > 0
        assert max(r.attempt for r in reqs) >= 1  # requeued work went out again under a new attempt
        await link.close()
        await host.stop()

    asyncio.run(main())


# ----------------------------------------------------------------------------- the orphan guard
# (real processes)
def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"      # a zombie has stopped running
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


GUARDED = ("from forge.cluster import guard; import sys, time; guard.install({pid}, {host!r}); "
           "print('ready', flush=True); time.sleep(30)")


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG "
                                                                               "is Linux")
def test_guard_ends_an_engine_process_whose_agent_is_gone():
    import socket
    import subprocess
    import sys

    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child = subprocess.Popen(
        [sys.executable, "-c", GUARDED.format(pid=agent.pid, host=socket.gethostname())],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        agent.kill()
        agent.wait()
        from forge.cluster.guard import EXIT_ORPHANED

        assert child.wait(5) == EXIT_ORPHANED
    finally:
        for p in (agent, child):
            if p.poll() is None:
                p.kill()


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG "
                                                                               "is Linux")
def test_guard_ends_an_engine_process_whose_raylet_is_gone():
    import subprocess
    import sys

    spawn = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
        "{code!r}]); "
        "print(p.pid, flush=True); time.sleep(30)"
    ).format(code=GUARDED.format(pid=None, host=None))
    parent = subprocess.Popen([sys.executable, "-c", spawn], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        # the child's line, through the shared pipe
        assert parent.stdout.readline().strip() == "ready"
        parent.kill()                                             # the "raylet" dies without a word
        parent.wait()
        assert _wait_gone(pid), "the guarded process outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


# ----------------------------------------------------------------------------- job counters, and
# Ray stays optional
def test_job_counters_count_from_attach_and_across_restarts():
    from forge.link.counters import JobCounters
    from forge.stats import EngineStats

    def st(ok: int) -> EngineStats:
        return EngineStats(
            node="n",
            card="cpu0",
            tier="t",
            token_budget=1,
            slots=1,
            kv_blocks_total=1,
            requests_ok=ok,
        )

    c = JobCounters()
    c.observe(st(100))                 # the engine already served 100 requests for earlier jobs
    c.observe(st(130))
    c.new_incarnation()                # it crashed and came back: its counters start again
    c.observe(st(0))
    c.observe(st(5))
    v = c.view(extra_requeued=2, healthy=True)
    assert v.requests_ok == 35 and v.requests_requeued == 2


def test_the_single_machine_path_never_imports_ray():
    import subprocess
    import sys

    code = ("import sys; sys.modules['ray'] = None\n"        # as if Ray were not installed
            "import forge.cli; forge.cli._register_all()\n"
            "from forge.cluster.connect import require_ray\n"
            "try:\n    require_ray()\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip() == "ForgeError --cluster needs Ray 2.60.0: pip install 'forge-llm[ray]'"
    )


def test_cluster_node_runs_requests_and_gives_up_on_engines_that_stay_gone(monkeypatch):
    from forge.cluster import client
    from forge.cluster.client import ClusterNode
    from forge.errors import NodeDown
    from forge.functions.api import GenerateParams

    monkeypatch.setattr(client, "SWEEP_INTERVAL_S", 0.05)
    monkeypatch.setattr(actor, "REATTACH_INTERVAL_S", 0.05)

    async def main():
        host = make_host()
        handle = InProcessHandle(host)
        node = ClusterNode("test", down_grace_s=0.3)
        node.attach([("engine:i1/cpu0", handle, await host.hello())])
        gens = await asyncio.gather(
            *(node.generate(f"prompt {i}", GenerateParams(max_tokens=3)) for i in range(50))
        )
        assert all(
            g.card == "i1/cpu0" and g.output_tokens == 3 and g.input_tokens > 2 for g in gens
        )
        assert node.engine_stats()[0].requests_ok == 50
        handle.broken = True                       # the only engine goes away and stays away
        with pytest.raises(NodeDown, match="gone for 0.3 s"):
            await asyncio.wait_for(node.generate([5, 6, 7], GenerateParams(max_tokens=3)), 10)
        await node.stop()
        await host.stop()

    asyncio.run(main())


def test_a_card_with_replicas_is_refused_on_a_cluster_before_ray_is_touched(tmp_path):
    """The agent runs one engine actor per card: `replicas: 2` is refused with the card's field,
    through the real CLI, before the (unreachable) head is even tried."""
    from tests.forge_cli import invoke

    node = Path(__file__).parents[1] / "node" / "fixtures" / "replicas-tiny.yaml"
    r = invoke("provision", node, "--cluster", "127.0.0.1:1")
    assert r.returncode == 1, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.strip()]
    assert line.endswith("replicas-tiny.yaml::$.cards[0].replicas: replicas: 2 runs on a node on "
                         "this machine only; "
                         "with --cluster each card runs one engine actor (set replicas: 1, or "
                         "provision without "
                         "--cluster)"), line
