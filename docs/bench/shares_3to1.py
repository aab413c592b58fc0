"""Shares of two CPU-bound cards at speeds 3:1 (`forge bench scaling`'s unequal cell), with the broker's speed EWMA
as it is ("new": bias-corrected) and as it was before (a0f8b8b, "old": seeded with each card's first delivery
report), interleaved in one process. docs/benchmarks.md, "Shares at 3:1 (CPU machine)".

    python docs/bench/shares_3to1.py harness [--records 600] [--repeat 8] [--out DIR]
    python docs/bench/shares_3to1.py trace   [--records 600] [--repeat 4] [--out DIR]

harness: the real harness (forge/bench/cards.py run_cards: each card alone, then both on one queue), worker
processes, the scaling cell's cards and workload; per run the fast card's share, its speed share from the alone
runs and together ÷ Σ alone. trace: the together run only, with the broker's weights, each card's held requests
and delivered tokens sampled every 10 ms; per run the weight ratio against the delivered ratio, each card's idle
time before the end, and the share over the whole run and over the window in which both cards still work.
Only the node process's Balancer.record is swapped (the broker that balances the cards lives there)."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import yaml

import forge.broker.dispatch as dispatch
from forge.bench.cards import CardsPlan, run_cards, summarize
from forge.bench.cpu_nodes import step_ms_for, write_cpu_node
from forge.bench.forge_mode import SPEC, _Opts, _warm, write_records
from forge.bench.modes import warmup_requests
from forge.bench.workload import WorkloadSpec, generate
from forge.config.load import load_node

NEW = dispatch.Balancer.record
WORKLOAD = Path(__file__).parent / "workloads" / "cpu-steps.yaml"


def old_record(self, i, tokens, elapsed_s, occupancy=1.0):
    """Balancer.record at a0f8b8b: the first sample taken as is, then a time-weighted EWMA."""
    if elapsed_s <= 0 or tokens < 0:
        return
    occupancy = min(1.0, max(occupancy, 1.0 / self.slots[i]))
    sample = tokens / (elapsed_s * occupancy)
    if self.rate[i] is None:
        self.rate[i] = sample
    else:
        self.rate[i] += (1.0 - 0.5 ** (elapsed_s / self.half_life_s)) * (sample - self.rate[i])
    self._refresh()


def use(variant: str) -> None:
    dispatch.Balancer.record = old_record if variant == "old" else NEW


def harness_run(loaded, spec, out: Path, records: int, variant: str) -> dict:
    got = run_cards(CardsPlan(loaded=loaded, spec=spec, workdir=out / variant / "work", modes=("forge",),
                              records=records, together_records=round(records * 4 / 3), warmup=8, repeat=1,
                              card_transport="process"))
    r = summarize([x.to_dict() for x in got], ["cpu0", "cpu1"])["forge"]["repeats"][0]
    tog = next(x for x in got if x.scope == "together")
    fast = r["shares"]["cpu0"]
    return {"share_cpu0": fast["share"], "speed_share_cpu0": fast["speed_share"],
            "points_off_nominal": round(abs(100 * fast["share"] - 75), 1), "points_off_speed": abs(fast["points_off"]),
            "together_over_sum": r["together_over_sum"], "together_window_s": round(tog.window_s, 2)}


async def _trace(loaded, spec, path: Path, work: Path) -> tuple[float, float, list]:
    from forge.functions.runner import run_records
    from forge.functions.store import open_store
    from forge.node.local import LocalNode
    from forge.stats import RunStats

    node = LocalNode(loaded, grouping=True, card_transport="process")
    await node.start()
    samples: list = []
    try:
        bal = node.broker.core._bal
        await _warm(node, warmup_requests(spec, loaded.plans[0].contract.model.vocab_size, 8))
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                toks = {s.card: s.input_tokens + s.output_tokens for s in node.engine_stats()}
                samples.append((time.perf_counter(), toks, list(bal.weight), list(bal.out_n), bal.pending_work))
                await asyncio.sleep(0.01)

        task = asyncio.create_task(sample())
        stats = RunStats()
        opts = _Opts(input_path=path, output_path=work / "out.jsonl", ledger_path=work / "ledger.sqlite")
        t0 = time.perf_counter()
        async with open_store(opts, function_name=SPEC.name, function_file=__file__, node=node.name,
                              stats=stats) as store:
            await run_records(spec=SPEC, node=node, records=store.records(), sink=store, stats=stats,
                              concurrency=1024, install_signals=False)
        t1 = time.perf_counter()
        await asyncio.sleep(0.05)
        done.set()
        await task
    finally:
        await node.stop()
    return t0, t1, samples


def trace_run(loaded, spec, path: Path, work: Path) -> dict:
    t0, t1, samples = asyncio.run(_trace(loaded, spec, path, work))
    base = next(s for s in samples if s[0] >= t0)[1]

    def tok(s, c):
        return s[1][c] - base[c]

    def at(t):
        return min(samples, key=lambda s: abs(s[0] - t0 - t))

    total = {c: tok(samples[-1], c) for c in ("cpu0", "cpu1")}
    last = {c: next(s[0] for s in samples if tok(s, c) == total[c]) - t0 for c in total}
    both = at(min(last.values()))
    a, b = at(0.75), at(1.75)
    return {"window_s": round(t1 - t0, 2), "share_cpu0": round(total["cpu0"] / sum(total.values()), 3),
            "share_cpu0_both_working": round(tok(both, "cpu0") / (tok(both, "cpu0") + tok(both, "cpu1")), 3),
            "weight_ratio_at_1_2_s": [round(at(t)[2][0] / at(t)[2][1], 2) for t in (1.0, 2.0)],
            "delivered_ratio_0.75_1.75_s": round((tok(b, "cpu0") - tok(a, "cpu0")) /
                                                 max(1, tok(b, "cpu1") - tok(a, "cpu1")), 2),
            "idle_before_end_s": {c: round(t1 - t0 - last[c], 2) for c in last}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("harness", "trace"))
    ap.add_argument("--records", type=int, default=600, help="records a card alone (together: 4/3 of it)")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/forge-shares-3to1"))
    a = ap.parse_args()
    spec = WorkloadSpec(**yaml.safe_load(WORKLOAD.read_text()))
    loaded = load_node(write_cpu_node(a.out / "nodes", "cpu-3to1", step_ms_for([3.0, 1.0])))
    together = round(a.records * 4 / 3)
    path = write_records(generate(spec, loaded.plans[0].contract.model.vocab_size, together),
                         a.out / "records-together.jsonl")
    rows = []
    for rep in range(a.repeat):
        for variant in ("old", "new"):
            use(variant)
            work = a.out / f"{variant}-{rep + 1}"
            work.mkdir(parents=True, exist_ok=True)
            row = (harness_run(loaded, spec, work, a.records, variant) if a.what == "harness"
                   else trace_run(loaded, spec, path, work))
            rows.append({"variant": variant, "repeat": rep + 1, **row})
            print(json.dumps(rows[-1]), flush=True)
    use("new")
    for variant in ("old", "new"):
        shares = [r["share_cpu0"] for r in rows if r["variant"] == variant]
        print(f"{variant}: fast card's share median {statistics.median(shares):.3f} "
              f"(range {min(shares):.3f}-{max(shares):.3f}, {len(shares)} runs)")
    (a.out / f"{a.what}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
