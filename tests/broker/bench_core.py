"""Micro-benchmark of the broker (not a test): python tests/broker/bench_core.py [N]

Two engines, N requests from 64 prompt families (a shared prefix of 1-4 blocks, then a unique tail;
prompts 20..380 tokens, 8..128 new tokens), built before timing. Every take is followed by on_done
for its requests. Reported: requests/s in CPU time of this process, best of 3 (the machine is
shared), for
  add-all-then-drain  add N requests, then take until empty
  steady              keep ~4k pending: add while below, then one take per engine
  asyncio             Broker.put from 4 producer tasks, Broker.take from one task per engine
with two geometries: the embedded tiny-llama contract (32 slots, 512-token budget, 32-token blocks,
512 KV blocks) and a large-card one (256 slots, 8192-token budget, 64-token blocks, 20000 KV
blocks)."""
from __future__ import annotations

import asyncio
import random
import sys
import time

from forge.broker import Broker, BrokerCore, BrokerRequest, EngineGeometry

SHAPES = {
    "tiny-llama": dict(
        max_batch_size=32, max_num_tokens=512, tokens_per_block=32, kv_blocks_total=512
    ),
    "large-card": dict(
        max_batch_size=256, max_num_tokens=8192, tokens_per_block=64, kv_blocks_total=20000
    ),
}


def engines(shape: str):
    return [EngineGeometry(f"gpu{i}", "tok", max_input_len=384, max_output_len=128, **SHAPES[shape])
            for i in range(2)]


def workload(n: int, seed: int = 0) -> list[BrokerRequest]:
    rnd = random.Random(seed)
    families = [
        tuple(rnd.randrange(3, 2048) for _ in range(32 * rnd.randint(1, 4))) for _ in range(64)
    ]
    reqs = []
    for k in range(n):
        head = families[rnd.randrange(len(families))]
        total = rnd.randint(20, 380)
        ids = (head + tuple(rnd.randrange(3, 2048) for _ in range(max(0, total - len(head)))))[
            :total
        ]
        reqs.append(BrokerRequest(f"r{k}", {"tok": ids}, max_new_tokens=rnd.randint(8, 128)))
    return reqs


def drain_round(core: BrokerCore) -> int:
    got = 0
    for g in core.engines:
        batch = core.take(
            g.engine_id, free_slots=g.max_batch_size, free_kv_blocks=g.kv_blocks_total
        )
        got += len(batch)
        for r in batch:
            core.on_done(g.engine_id, r)
    return got


def add_then_drain(reqs, shape: str, grouping: bool) -> float:
    core = BrokerCore(engines(shape), grouping=grouping, max_pending=len(reqs) + 1)
    t0 = time.process_time()
    for r in reqs:
        core.add(r)
    taken = 0
    while taken < len(reqs):
        taken += drain_round(core)
    return len(reqs) / (time.process_time() - t0)


def steady(reqs, shape: str, grouping: bool, backlog: int = 4096) -> float:
    core = BrokerCore(engines(shape), grouping=grouping, max_pending=backlog * 2)
    t0 = time.process_time()
    it = iter(reqs)
    taken = added = 0
    while taken < len(reqs):
        while added < len(reqs) and core.pending() < backlog:
            core.add(next(it))
            added += 1
        taken += drain_round(core)
    return len(reqs) / (time.process_time() - t0)


def through_asyncio(reqs, shape: str, grouping: bool) -> float:
    async def main() -> None:
        broker = Broker(BrokerCore(engines(shape), grouping=grouping, max_pending=4096))
        left = [len(reqs)]

        async def produce(chunk):
            for r in chunk:
                await broker.put(r)

        async def consume(g):
            while left[0] > 0:
                batch = await broker.take(g.engine_id, free_slots=g.max_batch_size,
                                          free_kv_blocks=g.kv_blocks_total, timeout_s=0.05)
                left[0] -= len(batch)
                for r in batch:
                    broker.on_done(g.engine_id, r)

        await asyncio.gather(*(produce(reqs[k::4]) for k in range(4)),
                             *(consume(g) for g in broker.core.engines))

    t0 = time.process_time()
    asyncio.run(main())
    return len(reqs) / (time.process_time() - t0)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    reqs = workload(n)
    for shape in SHAPES:
        for grouping in (True, False):
            def best(fn):
                out = 0.0
                for _ in range(3):
                    for r in reqs:
                        r.attempt = 0
                    out = max(out, fn(reqs, shape, grouping))
                return out
            a, s, q = best(add_then_drain), best(steady), best(through_asyncio)
            print(f"{shape:10} grouping={grouping!s:5}  add-all-then-drain {a:9,.0f}  steady "
                  f"{s:9,.0f}  "
                  f"asyncio {q:9,.0f}  req/s")


if __name__ == "__main__":
    main()
