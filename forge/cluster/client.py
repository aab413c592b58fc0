"""ClusterNode: every engine provisioned on a Ray cluster, seen by a job as one node.

It is a node like the one on a single machine (forge/node/linked.py: one broker over every engine,
one link each, the same requests, answers and loss handling), so the ledger, output, resume, metrics
and report are the same code too (forge/functions/job.py). Only two things are Ray's: the engines
are actors found by name (actor.py's RayTransport carries the links' calls), and the driver has no
tokenizer of its own: prompts are tokenized by the engines, in batches (forge/link/encoder.py).

Down: when no engine a pending request fits has answered for `down_grace_s` (its nodes are gone and
not back), waiting is pointless: those requests fail with NodeDown, the job stops without error
rows, and the same command resumes once the nodes are back."""
from __future__ import annotations

import asyncio
import logging
import sys

from forge.cluster.actor import HELLO_TIMEOUT_S, RayTransport
from forge.cluster.names import ENGINE_ACTOR_PREFIX, NAMESPACE
from forge.errors import ForgeError
from forge.host.protocol import Hello
from forge.node.linked import LinkedNode

log = logging.getLogger("forge.cluster")

DOWN_GRACE_S = 60.0           # engines a request fits all gone this long: NodeDown
SWEEP_INTERVAL_S = 1.0
START_TIMEOUT_S = 60.0        # engines still loading after this are left out of the job


def list_engine_actors(ray) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == NAMESPACE and a["name"].startswith(ENGINE_ACTOR_PREFIX))


class ClusterNode(LinkedNode):
    label_prefix = ""

    def __init__(self, address: str, *, grouping: bool = True, down_grace_s: float = DOWN_GRACE_S):
        super().__init__(f"ray:{address}", grouping=grouping, down_grace_s=down_grace_s,
                         sweep_interval_s=min(SWEEP_INTERVAL_S, down_grace_s / 4))
        self.address = address

    async def start(self) -> None:
        import ray

        names = await asyncio.to_thread(list_engine_actors, ray)
        if not names:
            raise ForgeError(
                f"no engine is provisioned on the Ray cluster at {self.address}: run "
                f"`forge provision NODE.yaml --cluster {self.address}` on each machine"
            )
        handles = {}
        for n in names:
            try:
                handles[n] = await asyncio.to_thread(ray.get_actor, n, namespace=NAMESPACE)
            except ValueError:
                continue                       # gone between listing and lookup
        wait_s = max(START_TIMEOUT_S, HELLO_TIMEOUT_S)
        infos = await asyncio.gather(
            *(RayTransport(name, h).hello(timeout_s=wait_s) for name, h in handles.items()),
            return_exceptions=True,
        )
        found = []
        for (name, handle), info in zip(handles.items(), infos):
            if isinstance(info, BaseException):
                print(f"forge: engine {name.removeprefix(ENGINE_ACTOR_PREFIX)} left out of this "
                      "job: "
                      f"{type(info).__name__}: "
                      f"{str(info).strip().splitlines()[0][:200] if str(info).strip() else ''}",
                      file=sys.stderr, flush=True)
            else:
                found.append((name, handle, info))
        if not found:
            raise ForgeError(f"no engine on the Ray cluster at {self.address} answered within "
                             f"{START_TIMEOUT_S:g} s")
        self.attach(found)

    def attach(self, engines: list[tuple[str, object, Hello]]) -> None:
        """Build the job's broker over these engines (actor name, handle, hello) and start their
        links."""
        self.attach_links([(RayTransport(name, handle), info) for name, handle, info in engines])
        self._use_encoders(self.tokenizer_keys())
        nodes = sorted({lk.info.node for lk in self.links.values()})
        print(
            f"forge: cluster {self.address}: {len(self.links)} engine(s) on {len(nodes)} "
            "node(s): "
            + ", ".join(f"{eid} {lk.info.tier}" for eid, lk in sorted(self.links.items())),
            file=sys.stderr,
            flush=True,
        )

    def describe(self) -> dict:
        return {"node": self.name, "cards": [{"card": eid, "tier": lk.info.tier, "state": lk.state}
                                             for eid, lk in self.links.items()]}
