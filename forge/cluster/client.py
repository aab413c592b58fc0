"""ClusterNode: every engine provisioned on a Ray cluster, seen by a job as one node.

It offers what the job runner asks of any node (generate, embed), so the ledger, output, resume, metrics
and report are the same code as on one machine (forge/functions/job.py). The job's broker lives here, in
the driver: one BrokerCore over every engine in the cluster, each geometry read from that engine's own
contract, so grouping, token budgets, prefix affinity and speed-proportional balancing work across nodes
exactly as across the cards of one machine. Requests travel to engines in batches (links.py).

Down: when no engine a pending request fits has answered for `down_grace_s` (its nodes are gone and not
back), waiting is pointless: those requests fail with NodeDown, the job stops without error rows, and
the same command resumes once the nodes are back."""
from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from typing import Optional, Sequence

from forge.broker import Broker, BrokerCore, BrokerRequest, NoEngineFits
from forge.cluster.encoder import EncodeFailed, Encoder
from forge.cluster.links import HELLO_TIMEOUT_S, EngineLink, geometry_of
from forge.cluster.names import ENGINE_ACTOR_PREFIX, NAMESPACE
from forge.engines.interface import Guide, Sampling
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.functions.api import GenerateParams, Generation, prompt_problem
from forge.runtime.options import RequestOptions
from forge.stats import BrokerStats, EngineStats

log = logging.getLogger("forge.cluster")

DOWN_GRACE_S = 60.0           # engines a request fits all gone this long: NodeDown
SWEEP_INTERVAL_S = 1.0
START_TIMEOUT_S = 60.0        # engines still loading after this are left out of the job


def list_engine_actors(ray) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == NAMESPACE and a["name"].startswith(ENGINE_ACTOR_PREFIX))


class ClusterNode:
    def __init__(self, address: str, *, grouping: bool = True, down_grace_s: float = DOWN_GRACE_S):
        self.address, self.grouping, self.down_grace_s = address, grouping, down_grace_s
        self.name = f"ray:{address}"
        self.job = uuid.uuid4().hex[:12]
        self.links: dict[str, EngineLink] = {}
        self.encoders: dict[str, Encoder] = {}
        self.broker: Optional[Broker] = None
        self._futures: dict[str, asyncio.Future] = {}
        self._sweeper: Optional[asyncio.Task] = None
        self.closed = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        import ray

        names = await asyncio.to_thread(list_engine_actors, ray)
        if not names:
            raise ForgeError(f"no engine is provisioned on the Ray cluster at {self.address}: run "
                             f"`forge provision NODE.yaml --cluster {self.address}` on each machine")
        handles = {}
        for n in names:
            try:
                handles[n] = await asyncio.to_thread(ray.get_actor, n, namespace=NAMESPACE)
            except ValueError:
                continue                       # gone between listing and lookup
        infos = await asyncio.gather(*(self._hello(h) for h in handles.values()), return_exceptions=True)
        found = []
        for (name, handle), info in zip(handles.items(), infos):
            if isinstance(info, BaseException):
                print(f"forge: engine {name.removeprefix(ENGINE_ACTOR_PREFIX)} left out of this job: "
                      f"{type(info).__name__}: {str(info).strip().splitlines()[0][:200] if str(info).strip() else ''}",
                      file=sys.stderr, flush=True)
            else:
                found.append((name, handle, info))
        if not found:
            raise ForgeError(f"no engine on the Ray cluster at {self.address} answered within {START_TIMEOUT_S:g} s")
        self.attach(found)

    def attach(self, engines: list[tuple[str, object, dict]]) -> None:
        """Build the job's broker over these engines (actor name, handle, hello) and start their links."""
        self.broker = Broker(BrokerCore([geometry_of(info) for _, _, info in engines], grouping=self.grouping,
                                        node=self.name))
        by_key: dict[str, list[EngineLink]] = {}
        for name, handle, info in engines:
            lk = EngineLink(name, handle, info, broker=self.broker, job=self.job, settle=self._settle, fail=self._fail)
            self.links[lk.eid] = lk
            by_key.setdefault(lk.key, []).append(lk)
        self.encoders = {k: Encoder(k, v) for k, v in by_key.items()}
        for lk in self.links.values():
            lk.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="cluster-sweep")
        nodes = sorted({lk.info["node"] for lk in self.links.values()})
        print(f"forge: cluster {self.address}: {len(self.links)} engine(s) on {len(nodes)} node(s): "
              + ", ".join(f"{eid} {lk.info['tier']}" for eid, lk in sorted(self.links.items())), file=sys.stderr,
              flush=True)

    async def _hello(self, handle) -> dict:
        return await asyncio.wait_for(handle.hello.remote(), max(START_TIMEOUT_S, HELLO_TIMEOUT_S))

    async def stop(self) -> None:
        self.closed = True
        if self.broker is not None:
            self.broker.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await asyncio.gather(*(lk.close() for lk in self.links.values()), return_exceptions=True)
        await asyncio.gather(*(e.close() for e in self.encoders.values()), return_exceptions=True)
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(ForgeError(f"{self.name}: the job stopped before the request finished"))
        self._futures.clear()

    # ------------------------------------------------------------------ requests
    async def encode(self, prompt: str | Sequence[int]) -> dict[str, tuple[int, ...]]:
        why = prompt_problem(prompt)        # text no tokenizer takes must not fail the batch it would travel in
        if why is not None:
            raise RequestRejected(why)
        if not isinstance(prompt, str):
            ids = tuple(int(i) for i in prompt)
            return {k: ids for k in self.encoders}
        keys = list(self.encoders)
        got = await asyncio.gather(*(self.encoders[k].encode(prompt) for k in keys), return_exceptions=True)
        out = {k: g for k, g in zip(keys, got) if not isinstance(g, BaseException)}
        if not out:
            raise NodeDown(f"{self.name}: no engine could tokenize the prompt ({got[0]})")
        for g in got:
            if isinstance(g, BaseException) and not isinstance(g, EncodeFailed):
                raise g
        return out

    async def generate(self, prompt: str | Sequence[int], params: GenerateParams) -> Generation:
        return (await self.submit(prompt, params))[0]

    async def embed(self, prompt: str | Sequence[int]) -> list[float]:
        gen, res = await self.submit(prompt, GenerateParams(max_tokens=1, embed=True))
        if res[5] is None:
            raise ForgeError(f"card {gen.card}: its backend returns no hidden state")
        return list(res[5])

    async def submit(self, prompt: str | Sequence[int], params: GenerateParams) -> tuple[Generation, tuple]:
        if self.closed or self.broker is None:
            raise RequestRejected(f"{self.name} is not accepting requests")
        if params.max_tokens <= 0:
            raise RequestRejected(f"max_tokens must be positive, got {params.max_tokens}")
        prompts = await self.encode(prompt)
        guide = None
        if params.choice is not None or params.json_schema is not None:
            guide = Guide(choice=tuple(params.choice) if params.choice is not None else None,
                          json_schema=params.json_schema)
        opts = RequestOptions(sampling=Sampling(temperature=params.temperature, top_p=params.top_p,
                                                top_k=params.top_k, seed=params.seed),
                              guide=guide, want_hidden=params.embed, deadline_s=params.deadline_s)
        req = BrokerRequest(request_id=uuid.uuid4().hex, prompts=prompts, max_new_tokens=params.max_tokens,
                            payload=opts, priority=params.priority)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._futures[req.request_id] = fut
        try:
            await self.broker.put(req)
        except NoEngineFits as e:
            self._futures.pop(req.request_id, None)
            raise RequestRejected(str(e)) from None
        except BaseException:
            self._futures.pop(req.request_id, None)
            raise
        try:
            eid, res = await fut
        finally:
            self._futures.pop(req.request_id, None)
        _, _, finish, ids, text, _, error, n_in = res
        if finish == "error" or error:
            raise ForgeError(f"card {eid}: {error or 'engine error'}")
        gen = Generation(text=text, output_tokens=len(ids), input_tokens=n_in, finish_reason=finish, card=eid,
                         token_ids=tuple(ids))
        return gen, res

    def _settle(self, req: BrokerRequest, eid: str, res: tuple) -> None:
        fut = self._futures.get(req.request_id)
        if fut is not None and not fut.done():
            fut.set_result((eid, res))

    def _fail(self, req: BrokerRequest, message: str, cls: type = ForgeError) -> None:
        fut = self._futures.get(req.request_id)
        if fut is not None and not fut.done():
            fut.set_exception(cls(message))

    # ------------------------------------------------------------------ nodes that do not come back
    async def _sweep(self) -> None:
        while not self.closed:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            gone = {eid for eid, lk in self.links.items()
                    if lk.state == "gone" or (lk.state == "down" and now - lk.down_since >= self.down_grace_s)}
            if not gone or not self.broker.pending():
                continue
            core = self.broker.core
            pending = core.drain()
            kept = 0
            for req in pending:
                alive = [e for e in core.fitting_engines(req) if e not in gone]
                if alive:
                    core.add(req)
                    kept += 1
                else:
                    self._fail(req, f"{self.name}: every engine this request fits ({', '.join(core.fitting_engines(req))}) "
                               f"has been gone for {self.down_grace_s:g} s", NodeDown)
            self.broker.notify()
            if kept < len(pending):
                log.error("%s: %d request(s) failed: engines %s gone for %g s", self.name, len(pending) - kept,
                          ", ".join(sorted(gone)), self.down_grace_s)

    # ------------------------------------------------------------------ observation
    def engine_stats(self) -> list[EngineStats]:
        return [s for lk in self.links.values() if (s := lk.stats()) is not None]

    def broker_stats(self) -> BrokerStats:
        return self.broker.stats() if self.broker else BrokerStats(node=self.name)
