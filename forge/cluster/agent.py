"""`forge provision NODE.yaml --cluster ADDRESS`: the node agent.

It validates the node and checks its hardware exactly as on one machine, joins the Ray cluster
(raynode.py), creates one engine actor per card (actor.py) pinned to this machine and holding that
card's forge_card and forge_tier resources, and then watches: engine stats to Prometheus (the node's
metrics port) and to the node's record (record.py) for `forge status --cluster`. The agent owns its
actors: when it exits, however it exits, its engines go with it. SIGINT/SIGTERM drain the engines
(bounded) before they are stopped."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from forge import constants
from forge.cluster.names import (
    NAMESPACE,
    engine_actor_name,
    engine_resources,
    node_record_name,
    node_resources,
)
from forge.cluster.raynode import RayNodeProcess, node_alive, wait_for_node
from forge.errors import ForgeError, engine_failed_to_start

if TYPE_CHECKING:  # the agent imports the engine's side only where it starts engines
    from forge.host.protocol import Hello

ENGINE_MAX_RESTARTS = 3          # Ray restarts a crashed engine actor on its card this many times
HEARTBEAT_S = 1.0
CALL_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 60.0
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PROGRESS_EVERY_S = 5.0  # while engines load, a line this often (a big model loads for minutes)


def ray_error_line(e: BaseException) -> str:
    """The one line of a Ray error worth showing (its cause's last line, not Ray's traceback)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error:" in ln or "Exception:" in ln:
            # forge's own errors speak for themselves
            return re.sub(r"^forge\.errors\.\w+: ", "", ln)[:500]
    return (lines[-1] if lines else type(e).__name__)[:500]


def refuse_replicas(loaded) -> None:
    """The agent starts one engine actor per card (start_engines); a card declaring N replicas would
    run one engine where the node says N, or none (a transformers factory refuses a whole-card plan
    of N: plan.one_engine). Refused here, before Ray is touched, with the card's field."""
    from forge.errors import ConfigError, Problem, display_path

    problems = [Problem(display_path(loaded.node.source), f"$.cards[{i}].replicas",
                        f"replicas: {c.replicas} runs on a node on this machine only; with "
                        "--cluster each card runs "
                        "one engine actor (set replicas: 1, or provision without --cluster)")
                for i, c in enumerate(loaded.node.cards) if c.replicas > 1]
    if problems:
        raise ConfigError(problems)


def refuse_cluster_switch_off(platform: str = sys.platform) -> None:
    """`ray start --address` starts this machine's Ray node only where Ray allows a multi-node
    cluster: on Linux unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER says 0, on macOS and Windows only
    where it says 1 (Ray's reading, env_bool). Otherwise it refuses after a while, in its own log:
    said here, before anything starts."""
    from forge.errors import UsageError

    value = os.environ.get(CLUSTER_SWITCH)
    default_on = platform not in ("darwin", "win32")
    if (value.lower() in ("1", "true")) if value is not None else default_on:
        return
    if value is None:
        raise UsageError(f"on {platform}, Ray starts a second Ray node on a machine (this node's, "
                         "beside the head) only "
                         f"with {CLUSTER_SWITCH}=1: export it, or attach to a Ray node you started "
                         "with --ray-node existing")
    raise UsageError(f"{CLUSTER_SWITCH}={value} stops `ray start --address` from starting this "
                     "machine's Ray node: "
                     "unset it (forge needs no such setting for 127.0.0.1), or attach to a Ray "
                     "node you started "
                     "with --ray-node existing")


class Agent:
    def __init__(self, loaded, address: str):
        self.loaded, self.address = loaded, address
        self.name = loaded.node.node
        self.resources = node_resources(loaded)
        self.raylet: Optional[RayNodeProcess] = None
        self.owned = False
        self.node_id = ""
        self.engines: dict[str, Any] = {}   # card id -> actor handle
        self.infos: dict[str, Hello] = {}   # card id -> the engine's hello
        self.threads: dict[str, dict] = {}  # card id -> the engine's threads (EngineActor.threads)
        self.record: Any = None
        self.metrics: Any = None
        self.metrics_url = ""

    # ------------------------------------------------------------------ joining
    def join(self, mode: str, stop: threading.Event) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from forge.cluster.connect import connect, unreachable, unreachable_line
        from forge.cluster.record import NodeRecord
        from forge.machine.registry import home

        why = unreachable(self.address)
        if why:
            raise ForgeError(unreachable_line(self.address, why))
        if mode == "start":
            log_path = home() / "cluster" / f"{self.name}.ray-start.log"
            self.say(f"starting this machine's Ray node for the cluster at {self.address} (log: "
                     f"{log_path})")
            self.raylet = RayNodeProcess(
                self.address, self.resources, self.loaded.node.host.cpu_cores, log_path
            )
        self.owned = connect(self.address)
        self.node_id = wait_for_node(ray, self.name, self.resources, self.raylet)
        self.say(f"Ray node {self.node_id[:12]} is in the cluster ({self.node_cpus(ray):g} CPU(s))")
        taken = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == NAMESPACE
            and (
                a["name"] == node_record_name(self.name)
                or a["name"].startswith(engine_actor_name(self.name, ""))
            )
        ]
        if taken:
            raise ForgeError(f"node {self.name} is already provisioned on the cluster at "
                             f"{self.address} "
                             f"({', '.join(sorted(taken))}): stop its agent first")
        info = {
            "node": self.name,
            "host": socket.gethostname(),
            "agent_pid": os.getpid(),
            "ray_node_id": self.node_id,
            "description": str(self.loaded.node.source),
            "started_at": time.time(),
            "resources": self.resources,
            "ray_node": "started by the agent" if self.raylet else "existing",
        }
        self.record = (
            ray.remote(NodeRecord)
            .options(
                name=node_record_name(self.name),
                namespace=NAMESPACE,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id, soft=False),
            )
            .remote(info)
        )

    def start_engines(self, stop: threading.Event) -> float:
        """One engine actor per card, each built on this machine from its card's contract, holding
        the CPUs its card's threads need (threads.py); waits (bounded) for all, saying every
        PROGRESS_EVERY_S which are still loading."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from forge.cluster.actor import EngineActor
        from forge.cluster.threads import cpu_reservations

        t0 = time.monotonic()
        host_cls = ray.remote(EngineActor)
        source = str(Path(self.loaded.node.source).resolve())
        cpus, warnings = cpu_reservations(
            self.loaded.plans, self.loaded.node.host.cpu_cores, self.node_cpus(ray)
        )
        for w in warnings:
            self.say(f"warning: {w}")
        for p in self.loaded.plans:
            self.engines[p.card_id] = host_cls.options(
                name=engine_actor_name(self.name, p.card_id),
                namespace=NAMESPACE,
                num_cpus=cpus[p.card_id],
                num_gpus=0,
                resources=engine_resources(p),
                max_restarts=ENGINE_MAX_RESTARTS,
                max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id, soft=False),
            ).remote(
                source,
                p.card.index,
                {"pid": os.getpid(), "host": socket.gethostname(), "tier": p.contract.contract},
            )
        plans = {p.card_id: p for p in self.loaded.plans}
        self.say(f"loading {len(plans)} engine(s): " + ", ".join(
            f"{cid} ({p.contract.contract}, {p.contract.backend})" for cid, p in plans.items())
            + f"; at most {constants.ENGINE_START_TIMEOUT_S:g} s")
        refs = {h.hello.remote(): cid for cid, h in self.engines.items()}
        deadline = time.monotonic() + constants.ENGINE_START_TIMEOUT_S
        next_word = time.monotonic() + PROGRESS_EVERY_S
        waiting = list(refs)
        while waiting:
            if stop.is_set():
                raise ForgeError(f"node {self.name}: stopped while its engines were loading")
            if time.monotonic() > deadline:
                raise ForgeError(f"node {self.name}: card(s) {', '.join(refs[r] for r in waiting)} "
                                 "did not load within "
                                 f"{constants.ENGINE_START_TIMEOUT_S:g} s")
            ready, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=0.5)
            for ref in ready:
                cid = refs[ref]
                try:
                    self.infos[cid] = ray.get(ref)
                except ray.exceptions.RayError as e:
                    raise engine_failed_to_start(
                        cid, plans[cid].contract.contract, ray_error_line(e)
                    ) from None
                self.say(f"card {cid} ({plans[cid].contract.contract}) up in "
                         f"{time.monotonic() - t0:.1f} s"
                         + self.threads_word(cid))
            if waiting and time.monotonic() >= next_word:
                next_word += PROGRESS_EVERY_S
                self.say(f"still loading {', '.join(refs[r] for r in waiting)} "
                         f"({time.monotonic() - t0:.0f} s; "
                         f"{len(self.infos)} of {len(refs)} up)")
        return time.monotonic() - t0

    def node_cpus(self, ray) -> float:
        return next(
            (
                n.get("Resources", {}).get("CPU", 0.0)
                for n in ray.nodes()
                if n.get("NodeID") == self.node_id
            ),
            0.0,
        )

    def threads_word(self, cid: str) -> str:
        """', N thread(s)' for the card's engine, and a warning line where it runs fewer than its
        card has."""
        import ray

        try:
            got = ray.get(self.engines[cid].threads.remote(), timeout=CALL_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as e:
            self.say(f"warning: card {cid}: cannot tell its engine's threads ({ray_error_line(e)})")
            return ""
        self.threads[cid] = got
        if got["wanted"] and got["threads"] < got["wanted"]:
            self.say(f"warning: card {cid}: its engine runs {got['threads']} thread(s), not the "
                     f"{got['wanted']} its "
                     f"card has: {'; '.join(got['problems'])}")
        return f", {got['threads']} thread(s)" if got["threads"] else ""

    def say(self, line: str) -> None:
        """A progress or warning line of this agent, on stderr (stdout carries the one line that
        says it is up)."""
        print(f"forge: node {self.name}: {line}", file=sys.stderr, flush=True)

    def announce(
        self, metrics_port: Optional[int], ready_file: Optional[str], load_s: float
    ) -> None:
        from forge.metrics import ForgeMetrics

        m = self.loaded.node.metrics
        self.metrics = ForgeMetrics()
        _, port = self.metrics.serve(m.host, m.port if metrics_port is None else metrics_port)
        self.metrics_url = f"http://{m.host}:{port}/metrics"
        cards = ", ".join(f"{cid} {info.tier}" for cid, info in self.infos.items())
        print(f"forge: node {self.name} joined the Ray cluster at {self.address} (Ray node "
              f"{self.node_id[:12]}): "
              f"{len(self.engines)} engine(s) up in {load_s:.1f} s ({cards}) — metrics "
              f"{self.metrics_url}", flush=True)
        if ready_file:
            Path(ready_file).write_text(
                json.dumps(
                    {
                        "node": self.name,
                        "address": self.address,
                        "ray_node_id": self.node_id,
                        "metrics_url": self.metrics_url,
                        "engines": sorted(i.engine_id for i in self.infos.values()),
                    }
                )
                + "\n"
            )

    # ------------------------------------------------------------------ watching
    def serve(self, stop: threading.Event) -> int:
        import ray

        while not stop.wait(HEARTBEAT_S):
            if self.raylet is not None and not self.raylet.alive():
                print(
                    f"forge: node {self.name}: {self.raylet.failure()}", file=sys.stderr, flush=True
                )
                return 1
            if not node_alive(ray, self.node_id):
                print(f"forge: node {self.name}: its Ray node {self.node_id[:12]} is dead; the "
                      "agent exits",
                      file=sys.stderr, flush=True)
                return 1
            self.refresh("up")
        return 0

    def refresh(self, state: str) -> None:
        import ray

        refs = {h.stats.remote(): cid for cid, h in self.engines.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        cards = []
        for ref, cid in refs.items():
            info = self.infos[cid]
            row = {"card": cid, "engine_id": info.engine_id, "model": info.model, "tier": info.tier,
                   "backend": info.backend, "state": "unresponsive", "healthy": False}
            if ref in ready:
                try:
                    s = ray.get(ref)
                    row.update(
                        state="up" if s.healthy else "unhealthy",
                        healthy=s.healthy,
                        in_flight=s.in_flight,
                        tokens_per_s=round(s.tokens_per_s, 1),
                        output_tokens_per_s=round(s.output_tokens_per_s, 1),
                        requests_ok=s.requests_ok,
                    )
                    self.metrics.observe_engine(s)
                except ray.exceptions.ActorDiedError as e:
                    row["state"] = f"dead: {ray_error_line(e)}"
                except ray.exceptions.RayError as e:
                    row["state"] = f"restarting: {ray_error_line(e)}"
            cards.append(row)
        self.record.update.remote(state, cards)

    # ------------------------------------------------------------------ leaving
    def leave(self) -> None:
        import ray

        if ray.is_initialized():
            if self.engines and self.node_id and node_alive(ray, self.node_id):
                try:
                    self.record.update.remote("draining", [])
                    ray.wait(
                        [h.drain.remote(DRAIN_TIMEOUT_S) for h in self.engines.values()],
                        num_returns=len(self.engines),
                        timeout=DRAIN_TIMEOUT_S + CALL_TIMEOUT_S,
                    )
                    ray.wait(
                        [h.stop.remote() for h in self.engines.values()],
                        num_returns=len(self.engines),
                        timeout=constants.ENGINE_SHUTDOWN_TIMEOUT_S + CALL_TIMEOUT_S,
                    )
                except ray.exceptions.RayError:
                    pass
            for h in [*self.engines.values(), self.record]:
                if h is not None:
                    try:
                        ray.kill(h, no_restart=True)
                    except Exception:  # noqa: BLE001 - already gone
                        pass
        if self.metrics is not None:
            self.metrics.close()
        from forge.cluster.connect import disconnect

        disconnect(self.owned)
        if self.raylet is not None:
            self.raylet.stop()


def provision_on_cluster(
    loaded,
    address: str,
    *,
    ray_node: str = "start",
    metrics_port: Optional[int] = None,
    ready_file: Optional[str] = None,
) -> int:
    from forge.cluster.connect import check_environment, require_ray
    from forge.node.provision import check_hardware

    check_environment(address)
    require_ray()
    if ray_node == "start":
        refuse_cluster_switch_off()
    check_hardware(loaded)
    stop = threading.Event()

    def on_signal(*_) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    agent = Agent(loaded, address)
    try:
        agent.join(ray_node, stop)
        # ray.init installed its own (exit at once): ours drains
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        load_s = agent.start_engines(stop)
        agent.announce(metrics_port, ready_file, load_s)
        agent.refresh("up")
        rc = agent.serve(stop)
        print(f"forge: node {agent.name} leaving the cluster…", file=sys.stderr, flush=True)
        return rc
    finally:
        agent.leave()
