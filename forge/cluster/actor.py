"""One card's engine host as a Ray actor (the node agent creates one per card, see agent.py), and
the transport a cluster job's links reach it by. Not importing Ray at module level: the agent wraps
the class.

EngineActor is the engine host (forge/host/engine_host.py) plus what is Ray-specific: the node
description is loaded and validated on the card's own machine, the orphan guard (guard.py) is
installed, the engine id is node/card, and a failed engine ends the process so that Ray restarts the
actor on its card (its in-flight work is requeued by the jobs' links, which find the restarted actor
by its name)."""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from typing import Any

from forge.cluster import guard
from forge.cluster.names import NAMESPACE, engine_id as cluster_engine_id
from forge.cluster.threads import current_threads, give_threads
from forge.errors import ForgeError
from forge.host.engine_host import EngineHost
from forge.host.protocol import Hello, HostMethod
from forge.link.transport import Transport

log = logging.getLogger("forge.cluster.actor")

# after an engine failure: let links collect what was given back, then exit
FAILED_EXIT_DELAY_S = 1.0
EXIT_ENGINE_FAILED = 4
REATTACH_INTERVAL_S = 0.5
HELLO_TIMEOUT_S = 10.0


class EngineActor(EngineHost):
    def __init__(self, node_path: str, card_index: int, agent: dict):
        # agent: the agent's pid and host (watched), the tier it expects on this card, and `guard`
        # (False only where this class runs outside a Ray worker, e.g. unit tests: then it neither
        # installs the guard nor sets this process's cores and threads).
        self.guard = (
            guard.install(agent.get("pid"), agent.get("host")) if agent.get("guard", True) else {}
        )
        from forge.config.load import load_node

        loaded = load_node(node_path)
        plan = next((p for p in loaded.plans if p.card.index == card_index), None)
        if plan is None:
            raise ForgeError(f"{node_path}: no card with index {card_index} (the description "
                             "changed under the agent)")
        if agent.get("tier") and plan.contract.contract != agent["tier"]:
            raise ForgeError(f"{node_path}: card {plan.card_id} now runs {plan.contract.contract}, "
                             "not "
                             f"{agent['tier']} (the description changed under the agent; restart "
                             "it)")
        # Before the engine loads: Ray gave this worker OMP_NUM_THREADS=<num_cpus> (1 for none), not
        # the card's.
        self.thread_report = (
            give_threads(plan, loaded.node.host.cpu_cores)
            if agent.get("guard", True)
            else {"wanted": None, "threads": None, "cores": None, "problems": []}
        )
        super().__init__(
            plan, node=loaded.node.node, engine_id=cluster_engine_id(loaded.node.node, plan.card_id)
        )
        self.lifeline = self.guard

    async def threads(self) -> dict:
        """What the card was to get (give_threads's report) and what this process runs now."""
        return {**self.thread_report, "now": current_threads()}

    def on_engine_failed(self, why: str) -> None:
        log.error("engine %s failed (%s); the actor exits so Ray restarts it", self.engine_id, why)
        asyncio.get_running_loop().call_later(FAILED_EXIT_DELAY_S, os._exit, EXIT_ENGINE_FAILED)

    async def hello(self) -> Hello:
        return replace(await super().hello(), guard=self.guard, ray_node_id=_ray_node_id())


class RayTransport(Transport):
    """A link's calls as Ray actor calls. Ray restarts a crashed actor on its card (max_restarts); a
    node provisioned again creates a new actor under the same name: either way the link finds it
    back here."""

    def __init__(self, actor_name: str, handle: Any):
        self.name, self.handle = actor_name, handle

    async def call(self, method: HostMethod, *args: Any, timeout_s: float) -> Any:
        return await _remote(self.handle, method, args, timeout_s)

    async def reconnect(self, why: str, *, engine_failed: bool, incarnation: str) -> Hello:
        died = _actor_died_error()
        while True:
            await asyncio.sleep(REATTACH_INTERVAL_S)
            handle = self.handle
            try:
                info = await _remote(handle, HostMethod.HELLO, (), HELLO_TIMEOUT_S)
            except died:
                try:  # its node may have been provisioned again: same name, new actor
                    import ray

                    handle = await asyncio.to_thread(ray.get_actor, self.name, namespace=NAMESPACE)
                    info = await _remote(handle, HostMethod.HELLO, (), HELLO_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - not (yet) there
                    continue
            except Exception:  # noqa: BLE001 - unavailable, restarting, slow: try again
                continue
            if engine_failed and info.incarnation == incarnation:
                continue  # the failed actor has not exited yet: wait for its successor
            self.handle = handle
            return info

    async def close(self, timeout_s: float) -> None:
        """Engine actors outlive jobs: their agent stops them."""


async def _remote(handle: Any, method: HostMethod, args: tuple, timeout_s: float) -> Any:
    """One call of an engine actor (`handle.method.remote(*args)`), bounded by timeout_s."""
    return await asyncio.wait_for(getattr(handle, method.value).remote(*args), timeout_s)


def _actor_died_error() -> type:
    """Ray's "this actor is gone for good" error (a class nothing raises where Ray is absent)."""
    try:
        import ray

        return ray.exceptions.ActorDiedError
    except ImportError:
        return type("NoActorDiedError", (Exception,), {})


def _ray_node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except ImportError:
        return ""

