"""Shared pieces of the admission tests (test_card_admission.py, test_admission_stalls.py,
test_admission_tiny_engine.py; the instant and faults engines' tests too): contracts built in code,
and admission wired as in production.

Harness: one engine host's admission runtime taking from its LinkSessions, which the test fills as a
link does: wire tuples arriving on one session (from_wire, LinkSessions.put), never more at the host
than it may queue, results and given-back requests collected from that session
(LinkSessions.collect). A given-back request is sent again as its next attempt while the engine is
healthy and accepting, as the node's broker and link do; until then it waits here.

LinkedCards: several engine hosts behind one node broker, each reached by its EngineLink over the
thread transport, as a node wires them: how work moves between cards (delivered speed, a stall, a
crash)."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path
from typing import Optional

from forge.broker import Broker, BrokerCore, BrokerRequest
from forge.config.models import Card, Contract
from forge.config.plan import plan_card
from forge.host.admission import CardAdmission, geometry_from_plan
from forge.host.engine_host import MAX_PENDING_FACTOR
from forge.host.link_sessions import LinkSessions
from forge.host.request import HostRequest
from forge.host.wire import from_wire
from forge.link.link import EngineLink
from forge.link.thread import ThreadTransport
from forge.requests import DEFAULT_OPTIONS
from forge_bench.engines.faults import FaultsSection, FaultyEngine
from forge_bench.engines.instant import InstantEngine, InstantSection

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "forge" / "embedded" / "tiny-llama"
KEY = "default"
SESSION = "job-1"


def contract(
    *,
    name: str = "t",
    backend: str = "instant",
    slots: int = 8,
    kv_tokens: int = 4096,
    tpb: int = 32,
    max_in: int = 384,
    max_out: int = 128,
    sections: Optional[dict] = None,
    precision: str = "fp32",
) -> Contract:
    return Contract.model_validate(
        dict(
            contract=name,
            backend=backend,
            model=dict(
                architecture="LlamaForCausalLM",
                num_layers=4,
                num_kv_heads=4,
                head_dim=32,
                vocab_size=2048,
                weights_gib=0.0,
            ),
            artifact=dict(checkpoint=str(TINY)),
            precision=dict(weights=precision, kv_cache=precision),
            limits=dict(
                max_batch_size=slots,
                max_num_tokens=512,
                max_input_len=max_in,
                max_output_len=max_out,
            ),
            kv_cache=dict(
                tokens_per_block=tpb, max_tokens=kv_tokens, host_cache_size=0, block_reuse=True
            ),
            target=dict(kind="cpu"),
            sections=sections or {},
        )
    )


def plan(c: Contract, index: int = 0):
    return plan_card(Card(index=index, kind="cpu", model="cpu", memory_gib=2, engine=c.contract), c)


def instant(c: Contract, p, rate: Optional[float] = None) -> InstantEngine:
    return InstantEngine(c, p, InstantSection(tokens_per_s_limit=rate))


def faulty(c: Contract, p, rate: Optional[float] = None, **faults) -> FaultyEngine:
    return FaultyEngine(instant(c, p, rate), FaultsSection(wraps="instant", **faults))


def prompt(i: int, n: int = 20) -> tuple[int, ...]:
    return tuple(3 + (i * 31 + j) % 2000 for j in range(n))


async def until(cond, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


class _ResultsByRequest:
    """Results kept by request id (`self.results`): waiting for a set of them, and each delivered
    exactly once."""

    results: dict[str, list]

    async def wait_all(self, ids, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while not all(i in self.results for i in ids):
            assert time.monotonic() < end, (
                f"undelivered: {[i for i in ids if i not in self.results][:10]}"
            )
            await asyncio.sleep(0.005)

    def assert_exactly_once(self, ids) -> None:
        assert set(self.results) == set(ids)
        twice = {k: v for k, v in self.results.items() if len(v) != 1}
        assert not twice, twice


class Harness(_ResultsByRequest):
    """One card's admission runtime and its LinkSessions, fed as a link feeds it (the module
    docstring); records results by the node's request id and samples the admission bounds."""

    def __init__(self, p):
        self.plan = p
        g = geometry_from_plan(p, KEY)
        self.feed = LinkSessions(g, node="test", max_pending=MAX_PENDING_FACTOR * g.max_batch_size)
        # sent and not answered at most: the host never refuses one
        self.credit = self.feed.queue.max_pending
        self.feed.session(SESSION)
        self.results: dict[str, list] = {}           # rid -> [(card, EngineResult)]
        self.requests: dict[str, HostRequest] = {}   # rid -> its latest attempt at the host
        self.backlog: deque[tuple] = deque()         # wire items not sent yet (the node's broker)
        self.out = 0                                 # sent and not answered yet (the link's credit)
        self.runtimes: list[CardAdmission] = []
        self.tasks: list[asyncio.Task] = []
        self.max_in_flight: dict[str, int] = {}
        self.max_reserved: dict[str, int] = {}
        self._pump: Optional[asyncio.Task] = None

    def _deliver(self, req: HostRequest, result) -> None:
        assert result.request_id == req.key         # the engine answered under the key it was given
        self.feed.deliver(req, lambda: (self.plan.card_id, req, result))

    def start(self, engine, p, **kw) -> CardAdmission:
        assert p is self.plan and not self.runtimes, "one card per Harness (several: LinkedCards)"
        rt = CardAdmission(
            engine=engine,
            plan=p,
            source=self.feed,
            node="test",
            deliver=self._deliver,
            tokenizer_key=KEY,
            **kw,
        )
        self.runtimes.append(rt)
        self.tasks.append(asyncio.create_task(rt.run()))
        self._pump = asyncio.create_task(self._collect())
        return rt

    def put(
        self, n: int, *, prompt_len: int = 20, max_new: int = 16, payload=None, start: int = 0
    ) -> list[str]:
        """n new requests r<start>..: wire items of attempt 0 (payload: their RequestOptions, None
        for defaults)."""
        items = [
            (f"r{i}", 0, prompt(i, prompt_len), max_new, 0, payload, 0.0)
            for i in range(start, start + n)
        ]
        self.backlog.extend(items)
        self._send()
        return [it[0] for it in items]

    def pending(self) -> int:
        """Requests no runtime holds and no result answers: queued in the host, given back and not
        yet collected, or waiting here to be sent (again)."""
        return (
            self.feed.queue.pending()
            + len(self.feed.sessions[SESSION].returned)
            + len(self.backlog)
        )

    def _send(self) -> None:
        if not (self.feed.healthy and self.feed.accepting):
            return  # the node's broker sends an unhealthy engine nothing
        items = []
        while self.backlog and self.out < self.credit:
            items.append(self.backlog.popleft())
            self.out += 1
        if items:
            now = time.monotonic()
            reqs = [from_wire(it, SESSION, KEY, now) for it in items]
            self.requests.update((r.key.rid, r) for r in reqs)
            self.feed.put(SESSION, reqs)

    async def _collect(self) -> None:
        while True:
            got = await self.feed.collect(SESSION, 0.05, 4096)
            for card, req, result in got.results:
                self.out -= 1
                self.results.setdefault(req.key.rid, []).append((card, result))
            for rid, attempt in got.returned:
                self.out -= 1
                r = self.requests[rid]
                assert r.key.attempt == attempt
                opts = None if r.options is DEFAULT_OPTIONS else r.options
                self.backlog.appendleft(
                    (
                        rid,
                        attempt + 1,
                        r.prompt,
                        r.max_new_tokens,
                        r.priority,
                        opts,
                        time.monotonic() - r.enqueued_at,
                    )
                )
            self._send()

    async def sample(self) -> None:
        while True:
            for rt in self.runtimes:
                s = rt.stats()
                assert s.in_flight <= s.slots, (rt.engine_id, s)
                assert s.kv_blocks_reserved <= s.kv_blocks_total, (rt.engine_id, s)
                self.max_in_flight[rt.engine_id] = max(
                    self.max_in_flight.get(rt.engine_id, 0), s.in_flight
                )
                self.max_reserved[rt.engine_id] = max(
                    self.max_reserved.get(rt.engine_id, 0), s.kv_blocks_reserved
                )
            await asyncio.sleep(0.002)


    async def stop(self) -> None:
        await asyncio.wait_for(asyncio.gather(*(rt.stop() for rt in self.runtimes)), 10)
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        for rt in self.runtimes:
            assert rt._driver.join(2), f"{rt.engine_id}: driver thread still running"


class LinkedCards(_ResultsByRequest):
    """Engine hosts (each its LinkSessions and admission runtime, its engine built from the card's
    contract) behind one node broker, reached by EngineLinks over the thread transport. Results are
    kept by request id with the card's id."""

    def __init__(self, plans, *, stall_window_s: float):
        self.transports = [
            ThreadTransport(p, node="test", stall_window_s=stall_window_s) for p in plans
        ]
        self.results: dict[str, list] = {}           # request id -> [(engine id, result tuple)]
        self.failed: dict[str, str] = {}
        self.links: list[EngineLink] = []

    async def start(self) -> None:
        infos = [await t.start() for t in self.transports]
        geometries = [info.geometry for info in infos]
        # backends' tokenizers differ in class
        self.keys = sorted({g.tokenizer_key for g in geometries})
        self.broker = Broker(BrokerCore(geometries, node="test"))
        for t, info in zip(self.transports, infos):
            link = EngineLink(t, info, broker=self.broker, rid_prefix="job", settle=self._settle,
                              fail=lambda req, why: self.failed.__setitem__(req.request_id, why))
            link.start()
            self.links.append(link)

    def _settle(self, req: BrokerRequest, engine_id: str, result: tuple) -> None:
        self.results.setdefault(req.request_id, []).append((engine_id, result))

    def runtime(self, i: int) -> CardAdmission:
        return self.transports[i].host._rt

    def admission_task(self, i: int) -> asyncio.Task:
        return self.transports[i].host._tasks[0]

    def put(self, n: int, *, prompt_len: int = 20, max_new: int = 16, payload=None) -> list[str]:
        ids = []
        for i in range(n):
            ids_i = prompt(i, prompt_len)  # the same token ids for every card's tokenizer
            self.broker.put_nowait(
                BrokerRequest(
                    request_id=f"r{i}",
                    prompts={k: ids_i for k in self.keys},
                    max_new_tokens=max_new,
                    payload=payload,
                )
            )
            ids.append(f"r{i}")
        return ids

    def assert_exactly_once(self, ids) -> None:
        assert not self.failed, self.failed
        super().assert_exactly_once(ids)

    def by_card(self) -> list[str]:
        return [card for [(card, _)] in self.results.values()]

    async def stop(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links))
        await asyncio.gather(*(t.close(10) for t in self.transports))
