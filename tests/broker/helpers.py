"""Plain factories and a deterministic engine simulator for the broker tests (no engine, no
asyncio)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional

from forge.broker import BrokerCore, BrokerRequest, EngineGeometry

_ids = itertools.count()


def geom(
    engine_id: str = "e0",
    *,
    tok: str = "t",
    slots: int = 8,
    budget: int = 512,
    max_in: int = 384,
    max_out: int = 128,
    tpb: int = 16,
    kv: int = 4096,
) -> EngineGeometry:
    return EngineGeometry(
        engine_id=engine_id,
        tokenizer_key=tok,
        max_batch_size=slots,
        max_num_tokens=budget,
        max_input_len=max_in,
        max_output_len=max_out,
        tokens_per_block=tpb,
        kv_blocks_total=kv,
    )


def req(
    prompt, max_new: int = 8, *, tok: str = "t", priority: int = 0, rid: str | None = None
) -> BrokerRequest:
    return BrokerRequest(
        request_id=rid or f"q{next(_ids)}",
        prompts={tok: tuple(prompt)},
        max_new_tokens=max_new,
        priority=priority,
    )


def prefixed(family: int, length: int, uniq: int, prefix_len: int = 64) -> tuple[int, ...]:
    """A prompt whose first `prefix_len` tokens are shared by its family, the rest unique to
    `uniq`."""
    head = tuple(1000 * (family + 1) + k for k in range(prefix_len))
    tail = tuple(10_000_000 + uniq * 1000 + k for k in range(max(0, length - prefix_len)))
    return (head + tail)[:length]


def fits(r: BrokerRequest, g: EngineGeometry) -> bool:
    p = r.prompts.get(g.tokenizer_key)
    return (p is not None and len(p) <= g.max_input_len and r.max_new_tokens <= g.max_output_len
            and -(-(len(p) + r.max_new_tokens) // g.tokens_per_block) <= g.kv_blocks_total)


def blocks(r: BrokerRequest, g: EngineGeometry) -> int:
    return -(-(len(r.prompts[g.tokenizer_key]) + r.max_new_tokens) // g.tokens_per_block)


def work(r: BrokerRequest, g: EngineGeometry) -> int:
    return len(r.prompts[g.tokenizer_key]) + r.max_new_tokens


@dataclass
class SimEngine:
    geom: EngineGeometry
    speed: float                         # tokens per tick when every slot is busy
    inflight: list = field(default_factory=list)   # [request, remaining work, blocks]
    done: list = field(default_factory=list)
    healthy: bool = True
    # at_completion: start of the interval the next delivery report covers
    since: Optional[float] = None
    tokens: float = 0.0                  # work finished in that interval
    area: float = 0.0                    # busy slots x ticks in it


def simulate(
    core: BrokerCore,
    engines: list[SimEngine],
    reqs: list[BrokerRequest],
    *,
    feed_per_tick: int = 0,
    in_system: int = 0,
    max_ticks: int = 1_000_000,
    at_completion: bool = False,
) -> int:
    """Discrete time: each slot of an engine progresses speed/slots tokens per tick (a decode-bound
    batcher: a half-full engine delivers half its speed); finished requests are reported (on_done,
    and record_delivery with the share of slots that were busy); an engine with free slots calls
    take. Returns the makespan in ticks. Arrivals: everything up front; or feed_per_tick a tick
    (while the broker has room); or a closed loop keeping `in_system` requests pending or in flight
    (as `forge run --concurrency` does).

    at_completion: an engine as the CPU-bound instant one (a token budget per step;
    bench/forge_bench/engines/instant_steps.py) with deliveries reported as the admission runtime
    reports them (forge/host/progress.py). Its speed is shared by the requests it holds, so a
    part-full engine delivers its full speed and divided by occupancy reads faster than it is; and a
    report carries the whole work of the requests that finished over the busy time since the last
    report, so a batch's first (its pipeline fill) reads a fraction of its speed."""
    todo = list(reversed(reqs))
    if not feed_per_tick and not in_system:
        while todo:
            core.add(todo.pop())
    total = len(reqs)
    finished = 0
    for tick in range(max_ticks):
        for _ in range(feed_per_tick):
            if todo and core.has_room():
                core.add(todo.pop())
        while in_system and todo and core.pending() + core.in_flight() < in_system:
            core.add(todo.pop())
        order = engines if tick % 2 == 0 else engines[::-1]      # no engine always pulls first
        for e in order:
            g = e.geom
            if not e.healthy:
                continue
            busy = len(e.inflight)
            rate = e.speed / (busy if at_completion and busy else g.max_batch_size)
            delivered = 0.0
            still = []
            for item in e.inflight:
                step = min(rate, item[1])
                item[1] -= step
                delivered += step
                if item[1] <= 1e-9:
                    core.on_done(g.engine_id, item[0])
                    e.done.append(item[0])
                    finished += 1
                else:
                    still.append(item)
            e.inflight = still
            if at_completion:
                if busy and e.since is None:
                    e.since = float(tick)
                e.tokens += sum(work(r, g) for r in e.done[len(e.done) - (busy - len(still)):])
                e.area += busy
                if busy > len(still):
                    span = tick + 1 - e.since
                    core.record_delivery(
                        g.engine_id, int(e.tokens), span, e.area / span / g.max_batch_size
                    )
                    e.since, e.tokens, e.area = (float(tick + 1) if still else None), 0.0, 0.0
            elif delivered:
                core.record_delivery(
                    g.engine_id, int(round(delivered)), 1.0, busy / g.max_batch_size
                )
            free = g.max_batch_size - len(e.inflight)
            used = sum(it[2] for it in e.inflight)
            if free > 0:
                for r in core.take(
                    g.engine_id, free_slots=free, free_kv_blocks=g.kv_blocks_total - used
                ):
                    e.inflight.append([r, float(work(r, g)), blocks(r, g)])
        if finished == total:
            return tick + 1
    raise AssertionError(f"simulation did not finish in {max_ticks} ticks: {finished}/{total} "
                         "done, "
                         f"{core.pending()} pending")


def drain(
    core: BrokerCore, engine: str = "e0", *, slots: int = 8, kv: int = 4096, done: bool = True
) -> list:
    """Take until nothing is pending; returns the batches."""
    batches = []
    while core.pending():
        b = core.take(engine, free_slots=slots, free_kv_blocks=kv)
        assert b, "a take with full capacity returned nothing while work was pending"
        batches.append(b)
        if done:
            for r in b:
                core.on_done(engine, r)
    return batches
