"""Shared pieces of the runtime tests: contracts built in code, a broker, runtimes, and a checker that
every request is delivered exactly once while admission stays inside slots and KV blocks."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Optional

from forge.broker import Broker, BrokerCore, BrokerRequest
from forge.config.models import Card, Contract
from forge.config.plan import plan_card
from forge.engines.faults import FaultsSection, FaultyEngine
from forge.engines.instant import InstantEngine, InstantSection
from forge.host.admission import AdmissionRuntime, geometry_from_plan

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "forge" / "embedded" / "tiny-llama"
KEY = "default"


def contract(*, name: str = "t", backend: str = "instant", slots: int = 8, kv_tokens: int = 4096, tpb: int = 32,
             max_in: int = 384, max_out: int = 128, sections: Optional[dict] = None,
             precision: str = "fp32") -> Contract:
    return Contract.model_validate(dict(
        contract=name, backend=backend,
        model=dict(architecture="LlamaForCausalLM", num_layers=4, num_kv_heads=4, head_dim=32, vocab_size=2048,
                   weights_gib=0.0),
        artifact=dict(checkpoint=str(TINY)), precision=dict(weights=precision, kv_cache=precision),
        limits=dict(max_batch_size=slots, max_num_tokens=512, max_input_len=max_in, max_output_len=max_out),
        kv_cache=dict(tokens_per_block=tpb, max_tokens=kv_tokens, host_cache_size=0, block_reuse=True),
        target=dict(kind="cpu"), sections=sections or {}))


def plan(c: Contract, index: int = 0):
    return plan_card(Card(index=index, kind="cpu", model="cpu", memory_gib=2, engine=c.contract), c)


def instant(c: Contract, p, rate: Optional[float] = None) -> InstantEngine:
    return InstantEngine(c, p, InstantSection(tokens_per_s_limit=rate))


def faulty(c: Contract, p, rate: Optional[float] = None, **faults) -> FaultyEngine:
    return FaultyEngine(instant(c, p, rate), FaultsSection(wraps="instant", **faults))


def prompt(i: int, n: int = 20) -> tuple[int, ...]:
    return tuple(3 + (i * 31 + j) % 2000 for j in range(n))


class Harness:
    """One broker, any number of runtimes; records deliveries and samples the admission bounds."""

    def __init__(self, plans, **broker_kw):
        self.plans = plans
        self.broker = Broker(BrokerCore([geometry_from_plan(p, KEY) for p in plans], **broker_kw))
        self.results: dict[str, list] = {}
        self.runtimes: list[AdmissionRuntime] = []
        self.tasks: list[asyncio.Task] = []
        self.max_in_flight: dict[str, int] = {}
        self.max_reserved: dict[str, int] = {}
        self.requests: dict[str, BrokerRequest] = {}

    def deliver(self, card: str):
        def _deliver(req, result):
            assert result.request_id == req.request_id
            self.results.setdefault(req.request_id, []).append((card, result))
        return _deliver

    def start(self, engine, p, **kw) -> AdmissionRuntime:
        rt = AdmissionRuntime(engine=engine, plan=p, broker=self.broker, node="test",
                              deliver=self.deliver(p.card_id), tokenizer_key=KEY, **kw)
        self.runtimes.append(rt)
        self.tasks.append(asyncio.create_task(rt.run()))
        return rt

    def put(self, n: int, *, prompt_len: int = 20, max_new: int = 16, payload=None, start: int = 0) -> list[str]:
        ids = []
        for i in range(start, start + n):
            req = BrokerRequest(request_id=f"r{i}", prompts={KEY: prompt(i, prompt_len)}, max_new_tokens=max_new,
                                payload=payload)
            self.broker.put_nowait(req)
            self.requests[req.request_id] = req
            ids.append(req.request_id)
        return ids

    async def sample(self) -> None:
        while True:
            for rt in self.runtimes:
                s = rt.stats()
                assert s.in_flight <= s.slots, (rt.engine_id, s)
                assert s.kv_blocks_reserved <= s.kv_blocks_total, (rt.engine_id, s)
                self.max_in_flight[rt.engine_id] = max(self.max_in_flight.get(rt.engine_id, 0), s.in_flight)
                self.max_reserved[rt.engine_id] = max(self.max_reserved.get(rt.engine_id, 0), s.kv_blocks_reserved)
            await asyncio.sleep(0.002)

    async def wait_all(self, ids, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while not all(i in self.results for i in ids):
            assert time.monotonic() < end, f"undelivered: {[i for i in ids if i not in self.results][:10]}"
            await asyncio.sleep(0.005)

    def assert_exactly_once(self, ids) -> None:
        assert set(self.results) == set(ids)
        twice = {k: v for k, v in self.results.items() if len(v) != 1}
        assert not twice, twice

    async def stop(self) -> None:
        await asyncio.wait_for(asyncio.gather(*(rt.stop() for rt in self.runtimes)), 10)
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)
        for rt in self.runtimes:
            assert rt._driver.join(2), f"{rt.engine_id}: driver thread still running"
