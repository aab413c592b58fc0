"""The control-plane path with its CPU split between the node process and its card's worker, and with or without
forge's garbage-collector setting (forge/gc_tuning.py), interleaved in fresh processes:

    python docs/bench/control_plane_split.py [--records 50000] [--repeat 3] [--variants process,process-gc-default,thread]
                                             [--node-only]

Each run is `forge bench control-plane`'s path (records -> functions -> broker -> link -> worker's admission ->
instant engine (NO model) -> results -> ledger -> output), the node pinned to core 0 and the worker to the other
cores. Variants: process (the default), process-gc-default (Python's own collector thresholds, nothing frozen),
process-gc-off (no cyclic collection at all), thread (the card's host in the node's process, --card-transport
thread). --node-only: no records, functions or ledger, just `node.generate` for every prompt (token ids), 2,048
at a time: the node and its link alone."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(variant: str, records: int, work: Path, node_only: bool) -> dict:
    import gc

    import psutil

    if variant in ("process-gc-default", "process-gc-off"):
        import forge.gc_tuning as g

        g._tuned = True                          # as if already tuned: Python's defaults stay
        if variant == "process-gc-off":
            gc.disable()
    from forge_bench.control_plane import NEW_TOKENS, PROMPT_TOKENS, instant_node
    from forge_bench.forge_mode import SPEC, _Opts, write_records
    from forge_bench.workload import BenchRequest
    from forge.functions.api import GenerateParams
    from forge.functions.runner import run_records
    from forge.functions.store import open_store
    from forge.node.local import LocalNode
    from forge.stats import RunStats

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    reqs = [BenchRequest(index=i, prompt=tuple(3 + (i * 7 + j) % 2000 for j in range(PROMPT_TOKENS)),
                         max_new_tokens=NEW_TOKENS) for i in range(records)]
    path = write_records(reqs, work / "records.jsonl")

    async def main() -> dict:
        transport = "thread" if variant == "thread" else "process"
        node = LocalNode(instant_node(1024), card_transport=transport, worker_cpus=frozenset(cpus[1:]) or None)
        await node.start()
        worker = psutil.Process(node.transports[0].pid) if transport == "process" else None
        me = psutil.Process()
        stats = RunStats()
        opts = _Opts(input_path=path, output_path=work / "out.jsonl", ledger_path=work / "ledger.sqlite")
        c0, w0, t0 = me.cpu_times(), worker.cpu_times() if worker else None, time.perf_counter()
        if node_only:
            params = GenerateParams(max_tokens=NEW_TOKENS)
            prompts = [list(r.prompt) for r in reqs]
            for i in range(0, records, 2048):
                got = await asyncio.gather(*(node.generate(p, params) for p in prompts[i:i + 2048]))
                stats.done += len(got)
        else:
            store = open_store(opts, function_name=SPEC.name, function_file=__file__, node=node.name, stats=stats)
            async with store:
                await run_records(spec=SPEC, node=node, records=store.records(), sink=store, stats=stats,
                                  concurrency=1024, install_signals=False)
        wall = time.perf_counter() - t0
        c1, w1 = me.cpu_times(), worker.cpu_times() if worker else None
        await node.stop()
        node_cpu = c1.user + c1.system - c0.user - c0.system
        worker_cpu = (w1.user + w1.system - w0.user - w0.system) if worker else 0.0
        return {"done": stats.done, "wall_s": wall, "node_cpu_s": node_cpu, "worker_cpu_s": worker_cpu}

    return asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", default="process,process-gc-default,thread")
    ap.add_argument("--node-only", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(one(a.one, a.records, Path(d), a.node_only)))
        return
    what = "node.generate calls" if a.node_only else "records"
    print(f"{a.records:,} {what} per run; node process pinned to one core, worker on the others")
    print("| run | variant | load | done | wall s | node CPU s | tasks per node CPU-s | worker CPU s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i in range(a.repeat):
        for v in a.variants.split(","):
            load = os.getloadavg()[0]
            out = subprocess.run([sys.executable, __file__, "--one", v, "--records", str(a.records)]
                                 + (["--node-only"] if a.node_only else []),
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"| {i + 1} | {v} | {load:.1f} | {r['done']} | {r['wall_s']:.2f} | {r['node_cpu_s']:.2f} | "
                  f"{a.records / r['node_cpu_s']:,.0f} | {r['worker_cpu_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
