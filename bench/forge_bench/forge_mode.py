"""The "forge" and "fifo" modes: the workload as a forge job — records read from JSONL, one function
invocation per record (bounded pool), each calling llm.generate through the node's broker and
admission runtime, every result through the ledger (SQLite) into the output file. The path `forge
run` takes: the node in this process, its card's engine in a worker process (card_transport
"thread": in this process too). "fifo" is the same with the broker's grouping turned off.

The window runs from the first record read to the ledger's last commit; loading the engine and the
warm-up requests are outside it (as for the direct mode). With warm jobs, the node first runs that
many whole jobs of other records (own prompts and prefixes: nothing the measured job could reuse)
outside the window, so its card worker has run work before, as the direct mode's long-lived process
has."""
from __future__ import annotations

import asyncio
import json
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from forge import constants
from forge.config.load import LoadedDescription
from forge.functions.api import GenerateParams, function, spec_of
from forge.stats import EngineStats, RunStats
from forge_bench.gpu_sampler import GpuSampler, gpus_of
from forge_bench.results import ModeResult
from forge_bench.workload import BenchRequest


@function(name="bench_generate")
async def bench_generate(record: dict, llm) -> dict:
    """The bench's function: one generate per record, prompt given as token ids."""
    out = await llm.generate(record["prompt"], max_tokens=record["max_new_tokens"])
    return {"i": record["i"], "output_tokens": out.output_tokens, "finish": out.finish_reason}


SPEC = spec_of(bench_generate)


@dataclass
class _Opts:
    """The fields of forge.functions.job.JobOptions the store reads."""

    input_path: Path
    output_path: Path
    ledger_path: Path
    restart: bool = True


def write_records(requests: Sequence[BenchRequest], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in requests:
            f.write(
                json.dumps(
                    {"i": r.index, "prompt": list(r.prompt), "max_new_tokens": r.max_new_tokens},
                    separators=(",", ":"),
                )
                + "\n"
            )
    return path


async def _warm(node, warmup: Sequence[BenchRequest]) -> None:
    if warmup:
        await asyncio.gather(
            *(
                node.generate(list(r.prompt), GenerateParams(max_tokens=r.max_new_tokens))
                for r in warmup
            )
        )


SETTLE_LIMIT_S = 5.0
_SETTLED = ("engine_steps", "prefix_hit_tokens", "requests_ok", "input_tokens", "output_tokens")


async def settled_engine_stats(
    node, read_s: Optional[float] = None, limit_s: float = SETTLE_LIMIT_S
):
    """The node's engine stats once they have caught up with the engines: a read right after work
    ends can miss the last steps (and count them in the next window). Reads until two reads `read_s`
    apart agree (by default a little more than the node's engine_stats_lag_s: the second read then
    shows every step taken before the first), for at most `limit_s`. (A node's view of an idle card,
    as its link's collect replies carry it, is one long-poll old: waiting that out cost 1.4 s at
    each end of every window; a LinkedNode reads its hosts now instead.)"""
    def key(stats):
        return [(s.card, *(getattr(s, k) for k in _SETTLED)) for s in stats]

    read_s = node.engine_stats_lag_s * 1.25 if read_s is None else read_s
    deadline = time.monotonic() + limit_s
    stats = await node.read_engine_stats()
    while time.monotonic() < deadline:
        await asyncio.sleep(read_s)
        again = await node.read_engine_stats()
        if key(again) == key(stats):
            return again
        stats = again
    return stats


def _delta(after: int, before: int) -> int:
    return after - before


def per_card(before: Sequence[EngineStats], after: Sequence[EngineStats]) -> dict[str, dict]:
    """What each card delivered over the window (cumulative engine stats, after minus before)."""
    was = {s.card: s for s in before}
    out = {}
    for a in after:
        b = was.get(a.card)
        out[a.card] = {
            k: getattr(a, k) - (getattr(b, k) if b else 0)
            for k in (
                "input_tokens",
                "output_tokens",
                "requests_ok",
                "prefix_hit_tokens",
                "engine_steps",
            )
        }
    return out


async def _job(node, opts: _Opts, stats: RunStats, concurrency: int) -> None:
    """One whole job of the records at opts.input_path through the node, as `forge run` runs it."""
    from forge.functions.runner import run_records
    from forge.functions.store import open_store

    store = open_store(
        opts, function_name=SPEC.name, function_file=__file__, node=node.name, stats=stats
    )
    async with store:
        await run_records(spec=SPEC, node=node, records=store.records(), sink=store, stats=stats,
                          concurrency=concurrency, install_signals=False)


async def run_forge_async(
    loaded: LoadedDescription,
    records_path: Path,
    n_requests: int,
    workdir: Path,
    *,
    grouping: bool,
    warmup: Sequence[BenchRequest] = (),
    label: Optional[str] = None,
    concurrency: int = constants.DEFAULT_RECORD_CONCURRENCY,
    card_transport: str = "process",
    worker_cpus: Optional[frozenset[int]] = None,
    warm_records: Sequence[Path] = (),
) -> ModeResult:
    """warm_records: one whole job of each file runs on the node before the measured one (outside
    the window)."""
    from forge.node.local import LocalNode

    mode = label or ("forge" if grouping else "fifo")
    node = LocalNode(
        loaded, grouping=grouping, card_transport=card_transport, worker_cpus=worker_cpus
    )
    await node.start()
    try:
        await _warm(node, warmup)
        warm = RunStats()
        for path in warm_records:
            await _job(
                node,
                _Opts(
                    input_path=path,
                    output_path=workdir / f"{mode}.warm.out.jsonl",
                    ledger_path=workdir / f"{mode}.warm.ledger.sqlite",
                ),
                warm,
                concurrency,
            )
        e0, b0 = await settled_engine_stats(node), node.broker_stats()
        opts = _Opts(input_path=records_path, output_path=workdir / f"{mode}.out.jsonl",
                     ledger_path=workdir / f"{mode}.ledger.sqlite")
        stats = RunStats()
        sampler = GpuSampler(gpus_of(loaded.plans)).start()
        try:
            t0, c0, started_at = time.perf_counter(), time.process_time(), time.time()
            await _job(node, opts, stats, concurrency)
            window, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            gpu_util = sampler.stop()
        e1, b1 = await settled_engine_stats(node), node.broker_stats()
        # why no engine could work, when that is how the run ended
        down = getattr(node, "down", None)
    finally:
        await node.stop()
    res = ModeResult(
        mode=mode,
        variant="grouped" if grouping else "fifo",
        requests=n_requests,
        completed=stats.done,
        failed=stats.failed,
        input_tokens=stats.input_tokens,
        output_tokens=stats.output_tokens,
        window_s=window,
        cpu_s=cpu,
        started_at=started_at,
    )
    res.prefix_hit_tokens = sum(a.prefix_hit_tokens for a in e1) - sum(
        a.prefix_hit_tokens for a in e0
    )
    res.per_card = per_card(e0, e1)
    res.engine_steps = sum(c["engine_steps"] for c in res.per_card.values()) or None
    res.gpu_util, res.gpu_util_missing = gpu_util, sampler.missing
    res.affinity_hits = _delta(b1.affinity_hits, b0.affinity_hits)
    res.affinity_spills = _delta(b1.affinity_spills, b0.affinity_spills)
    batch = _delta(b1.batch_tokens, b0.batch_tokens)
    prompt = _delta(b1.prompt_tokens, b0.prompt_tokens)
    res.padding_ratio = _delta(b1.padded_tokens, b0.padded_tokens) / batch if batch else 0.0
    res.broker_prefix_reuse_ratio = (
        _delta(b1.shared_prefix_tokens, b0.shared_prefix_tokens) / prompt if prompt else 0.0
    )
    if warm_records:
        res.notes.append(f"after {len(warm_records)} warm job(s) on the same node ({warm.done} "
                         "records done, "
                         f"{warm.failed} failed; own prompts)")
    requeued = sum(a.requests_requeued for a in e1) - sum(a.requests_requeued for a in e0)
    if requeued:
        res.notes.append(f"{requeued} request(s) requeued by admission")
    if stats.failed:
        res.notes.append(f"{stats.failed} record(s) failed; see {opts.output_path}")
    if down:  # the cause, in the report: e.g. an engine's CUDA out-of-memory
        res.notes.append(textwrap.shorten(" ".join(str(down).split()), 400, placeholder=" …"))
    return res


def run_forge(
    loaded: LoadedDescription, records_path: Path, n_requests: int, workdir: Path, **kw
) -> ModeResult:
    return asyncio.run(run_forge_async(loaded, records_path, n_requests, workdir, **kw))
