"""The attempt limit (constants.REQUEST_ATTEMPT_LIMIT, forge/host/protocol.py::given_up) is applied
once on each way a request comes back, and a request at the limit is given up exactly once, with the
message of whoever gave it back: a real engine host (thread carrier) behind a node broker and its
EngineLink, the broker sending each request back as its next attempt."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from forge import constants
from forge.broker import Broker, BrokerCore, BrokerRequest
from forge.config.models import Card, Contract
from forge.config.plan import plan_card
from forge.link.link import EngineLink
from forge.link.thread import ThreadTransport

TINY = Path(__file__).resolve().parents[2] / "forge" / "embedded" / "tiny-llama"
LIMIT = constants.REQUEST_ATTEMPT_LIMIT


def _plan(backend: str, sections: dict):
    c = Contract.model_validate(
        dict(
            contract="t",
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
            precision=dict(weights="fp32", kv_cache="fp32"),
            limits=dict(
                max_batch_size=4, max_num_tokens=512, max_input_len=384, max_output_len=128
            ),
            kv_cache=dict(
                tokens_per_block=32, max_tokens=4096, host_cache_size=0, block_reuse=True
            ),
            target=dict(kind="cpu"),
            sections=sections,
        )
    )
    return plan_card(Card(index=0, kind="cpu", model="cpu", memory_gib=2, engine=c.contract), c)


class OneLink:
    """One engine host behind a node broker and its link; every answer and failure kept by request
    id."""

    def __init__(self, plan):
        self.transport = ThreadTransport(plan, node="test", stall_window_s=2.0)
        self.settled: dict[str, list] = {}
        self.failed: dict[str, list[str]] = {}

    async def start(self, *, before_link=None) -> None:
        info = await self.transport.start()
        self.key = info.geometry.tokenizer_key
        self.broker = Broker(BrokerCore([info.geometry], node="test"))
        if before_link is not None:
            before_link(self.transport.host)
        self.link = EngineLink(
            self.transport,
            info,
            broker=self.broker,
            rid_prefix="job",
            settle=lambda req, eid, res: self.settled.setdefault(req.request_id, []).append(res),
            fail=lambda req, why: self.failed.setdefault(req.request_id, []).append(why),
        )

    def put(self, rid: str, *, attempt: int = 0) -> None:
        self.broker.put_nowait(
            BrokerRequest(
                request_id=rid,
                prompts={self.key: tuple(range(3, 23))},
                max_new_tokens=4,
                attempt=attempt,
            )
        )

    async def until_answered(self, rid: str, timeout_s: float = 20.0) -> None:
        end = time.monotonic() + timeout_s
        while rid not in self.settled and rid not in self.failed:
            assert time.monotonic() < end, "no answer in time"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # a second answer, were there one, would come by now

    async def stop(self) -> None:
        await self.link.close()
        await self.transport.close(10)


def test_a_request_the_engine_keeps_refusing_is_given_up_once_by_the_host_with_its_reason(
    monkeypatch,
):
    monkeypatch.setattr(constants, "SUBMIT_RETRY_LIMIT", 1)
    monkeypatch.setattr(constants, "SUBMIT_BACKOFF_BASE_S", 0.001)
    plan = _plan(
        "faults", {"faults": {"wraps": "instant", "refuse_first_submits": 1000}, "instant": {}}
    )

    async def go():
        h = OneLink(plan)
        await h.start()
        h.link.start()
        h.put("r0")
        await h.until_answered("r0")
        stats = h.transport.host._rt.stats()
        await h.stop()
        return h, stats

    h, stats = asyncio.run(go())
    assert h.failed == {}
    [res] = h.settled["r0"]
    assert res.finish_reason == "error" and res.attempt == LIMIT
    assert res.error == f"engine refused it 2 times; gave up after {LIMIT + 1} attempts"
    assert stats.requests_requeued == LIMIT and stats.requests_failed == 1


def test_a_request_turned_away_at_the_limit_is_given_up_once_by_the_link_with_the_hosts_word():
    plan = _plan("instant", {"instant": {}})

    async def go():
        h = OneLink(plan)
        await h.start(before_link=lambda host: setattr(host.link_sessions, "accepting", False))
        # sent before the host's first reply tells the link it is draining
        h.put("r0", attempt=LIMIT)
        h.link.start()
        await h.until_answered("r0")
        await h.stop()
        return h

    h = asyncio.run(go())
    assert h.settled == {}
    assert h.failed == {"r0": [f"given back by the engine; gave up after {LIMIT + 1} attempts"]}


def test_a_request_lost_with_its_host_at_the_limit_is_given_up_once_by_the_link():
    # slow: still in flight when lost
    plan = _plan("instant", {"instant": {"tokens_per_s_limit": 5.0}})

    async def go():
        h = OneLink(plan)
        await h.start()
        h.put("r0", attempt=LIMIT)
        h.link.start()
        end = time.monotonic() + 10
        while not h.link.out:
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        h.link.lost("test: the host is gone", h.link.epoch)
        await h.until_answered("r0")
        await h.stop()
        return h

    h = asyncio.run(go())
    assert h.settled == {}
    assert h.failed == {"r0": ["engine cpu0 was lost (test: the host is gone); gave up after "
                               f"{LIMIT + 1} attempts"]}
