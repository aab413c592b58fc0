"""`forge bench run`: the three modes side by side in one invocation, on the same engine and the
same work.

    direct  the engine through its own API with the engine forge builds from the same contract (best of the
            variants run): transformers' continuous batching (direct.py) or vllm.LLM (direct_vllm.py)
    forge   the forge path: records -> functions -> broker (grouping) -> admission -> engine -> ledger
    fifo    the same with the broker's grouping off (plain FIFO)

Each mode starts from an empty KV cache and runs the same warm-up requests (own random prompts, no
shared prefix) before its window; with `warm_jobs` every mode first runs that many whole jobs of
other records — the forge modes on their node, the direct mode through the manager its window then
uses — so each engine has captured the CUDA graphs and grown the allocator that work of this shape
needs, as a long-running node has (its cache then holds only blocks the measured job cannot reuse).
Modes run in the order given, then, with `repeat`, in the reverse order, and so on (direct, forge;
forge, direct; direct, forge): a machine that drifts over the invocation (clocks, heat, a neighbour)
would otherwise always hand its drift to the same mode, and with alternation each mode runs as often
early as late in its pair (docs/benchmarks.md, "The tool"). Every run is kept in the report."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, TypeVar

from forge.config.load import LoadedDescription
from forge.errors import ForgeError, UsageError
from forge_bench.direct import DirectEngine, direct_engine
from forge_bench.direct_child import run_direct_in_child
from forge_bench.forge_mode import run_forge, write_records
from forge_bench.results import ModeResult, best
from forge_bench.workload import BenchRequest, WorkloadSpec, generate

MODES = ("direct", "forge", "fifo")
T = TypeVar("T")
WARMUP_SEED_OFFSET = 1_000_003         # warm-up prompts come from their own random stream
WARM_JOB_SEED_OFFSET = 2_000_003       # and a warm job's records from another (prefixes included)
log = logging.getLogger("forge.bench")


@dataclass
class BenchPlan:
    loaded: LoadedDescription
    spec: WorkloadSpec
    workdir: Path
    modes: Sequence[str] = MODES
    direct_variants: Sequence[str] = ("sorted", "depth")
    records: Optional[int] = None
    warmup: int = 8
    repeat: int = 1
    concurrency: Optional[int] = None
    # forge/fifo modes: cards in worker processes, or "thread" (before)
    card_transport: str = "process"
    warm_jobs: int = 0  # every mode: whole jobs of other records on the same engine first
    # direct mode: in the bench's process, or "child": a fresh one per run
    direct_process: str = "bench"
    progress: Callable[[str], None] = field(default=lambda line: None)
    on_result: Callable[[list[BenchRequest], list[ModeResult]], None] = field(
        default=lambda reqs, res: None
    )


def single_card(loaded: LoadedDescription):
    if len(loaded.plans) != 1:
        raise UsageError(f"node {loaded.node.node} has {len(loaded.plans)} cards; the bench "
                         "measures one engine "
                         "(give a node description with one card)")
    return loaded.plans[0]


def check_fits(spec: WorkloadSpec, plan) -> None:
    lim = plan.contract.limits
    if spec.longest_prompt() > lim.max_input_len or spec.longest_output() > lim.max_output_len:
        raise UsageError(f"workload {spec.workload}: prompts up to {spec.longest_prompt()} tokens "
                         "and outputs up to "
                         f"{spec.longest_output()} do not fit contract {plan.contract.contract} "
                         "(max_input_len "
                         f"{lim.max_input_len}, max_output_len {lim.max_output_len})")


def warmup_requests(spec: WorkloadSpec, vocab: int, n: int) -> list[BenchRequest]:
    if n <= 0:
        return []
    own = spec.model_copy(update={"seed": spec.seed + WARMUP_SEED_OFFSET, "shared_prefix": None})
    return [BenchRequest(index=r.index, prompt=r.prompt, max_new_tokens=min(r.max_new_tokens, 16))
            for r in generate(own, vocab, n)]


def warm_job_requests(spec: WorkloadSpec, vocab: int, n: int, k: int = 0) -> list[BenchRequest]:
    """Warm job k's records: the workload's lengths and shape from their own random stream, so no
    prompt or prefix is shared with the measured records or another warm job's (the engine's prefix
    cache gains nothing the next job could use)."""
    return generate(
        spec.model_copy(update={"seed": spec.seed + WARM_JOB_SEED_OFFSET + k}), vocab, n
    )


def run_modes(bp: BenchPlan) -> tuple[list[BenchRequest], list[ModeResult]]:
    plan = single_card(bp.loaded)
    check_fits(bp.spec, plan)
    unknown = [m for m in bp.modes if m not in MODES]
    if unknown:
        raise UsageError(f"--modes: unknown mode(s) {', '.join(unknown)} (choose from "
                         f"{', '.join(MODES)})")
    vocab = plan.contract.model.vocab_size
    requests = generate(bp.spec, vocab, bp.records)
    warm = warmup_requests(bp.spec, vocab, bp.warmup)
    records_path = write_records(requests, bp.workdir / "records.jsonl")
    results: list[ModeResult] = []
    direct: Optional[DirectEngine] = None
    kw = {"concurrency": bp.concurrency} if bp.concurrency else {}
    kw["card_transport"] = bp.card_transport
    warm_jobs = [warm_job_requests(bp.spec, vocab, len(requests), k) for k in range(bp.warm_jobs)]
    if warm_jobs and {"forge", "fifo"} & set(bp.modes):
        kw["warm_records"] = [write_records(job, bp.workdir / f"warm-records-{k}.jsonl")
                              for k, job in enumerate(warm_jobs)]
    if bp.direct_process not in ("bench", "child"):
        raise UsageError(f"--direct-process: {bp.direct_process!r} (bench | child)")
    if bp.direct_process == "child" and "direct" not in bp.modes:
        raise UsageError("--direct-process child: applies to the direct mode, and --modes has none")
    # A card bound to its own cores runs its direct mode in a process bound to them from its start,
    # as its worker is: threads of this process bound afterwards keep OpenMP's team sized for every
    # core (bench/forge_bench/direct_child).
    in_child = bp.direct_process == "child" or bool(plan.card.cores)
    try:
        for rep in range(bp.repeat):
            for mode in repeat_order(bp.modes, rep):
                if mode == "direct" and in_child:
                    for v in bp.direct_variants:
                        r = run_direct_in_child(
                            plan,
                            requests,
                            v,
                            warmup=warm,
                            workdir=bp.workdir,
                            tag=f"{rep + 1}-{v.replace(':', '')}",
                            warm_jobs=warm_jobs,
                        )
                        r.notes.append(f"repeat {rep + 1}")
                        results.append(r)
                        bp.progress(_line(r))
                        bp.on_result(requests, results)
                elif mode == "direct":
                    if direct is None:
                        t = time.perf_counter()
                        direct = direct_engine(plan)
                        bp.progress(f"direct: model built in {time.perf_counter() - t:.1f} s")
                    for v in bp.direct_variants:
                        r = direct.run(requests, v, warmup=warm, warm_jobs=warm_jobs)
                        r.notes.append(f"repeat {rep + 1}")
                        results.append(r)
                        bp.progress(_line(r))
                        bp.on_result(requests, results)
                else:
                    if direct is not None and bp.repeat == 1:
                        direct.close()  # free the card before forge loads its own engine
                        direct = None
                    r = run_forge(
                        bp.loaded,
                        records_path,
                        len(requests),
                        bp.workdir,
                        grouping=(mode == "forge"),
                        warmup=warm,
                        label=mode,
                        **kw,
                    )
                    r.notes.append(f"repeat {rep + 1}")
                    results.append(r)
                    bp.progress(_line(r))
                    bp.on_result(requests, results)
    finally:
        if direct is not None:
            direct.close()
    incomplete = [r for r in results if r.completed != r.requests]
    for r in incomplete:
        log.warning("%s/%s completed %d of %d requests", r.mode, r.variant, r.completed, r.requests)
    if results and len(incomplete) == len(results):
        raise ForgeError("no mode completed the workload; see the notes in the report")
    return requests, results


def repeat_order(runs: Sequence[T], rep: int) -> list[T]:
    """The runs' (modes', tiers', cards') order in repeat `rep` (from 0): as given in even repeats,
    reversed in odd ones."""
    return list(runs) if rep % 2 == 0 else list(reversed(runs))


def _line(r: ModeResult) -> str:
    return (f"{r.mode:>6} {r.variant:<10} {r.tokens_per_s:10,.0f} tok/s  "
            f"{r.output_tokens_per_s:9,.0f} out tok/s  "
            f"{r.completed}/{r.requests} in {r.window_s:.2f} s")


def ratios(results: list[ModeResult]) -> dict:
    """Best of each mode, and the ratios the targets are stated in (None where a mode did not
    run)."""
    by_mode = {m: best([r for r in results if r.mode == m]) for m in MODES}
    out: dict = {
        "best": {m: (r.variant if r else None) for m, r in by_mode.items()},
        "tokens_per_s": {m: (round(r.tokens_per_s, 2) if r else None) for m, r in by_mode.items()},
    }
    d, f, q = by_mode["direct"], by_mode["forge"], by_mode["fifo"]
    out["forge_over_direct"] = round(f.tokens_per_s / d.tokens_per_s, 4) if f and d else None
    out["forge_over_fifo"] = round(f.tokens_per_s / q.tokens_per_s, 4) if f and q else None
    out["fifo_over_direct"] = round(q.tokens_per_s / d.tokens_per_s, 4) if q and d else None
    reps = sorted({n for n in map(repeat_of, results) if n is not None})
    # the same ratios within each repeat: what "none below X" targets are stated in
    if len(reps) > 1:
        out["per_repeat"] = [
            dict(ratios([r for r in results if repeat_of(r) == n]), repeat=n) for n in reps
        ]
        for row in out["per_repeat"]:
            del row["best"], row["tokens_per_s"]
    return out


def repeat_of(r: ModeResult) -> Optional[int]:
    """The repeat a run belongs to (its "repeat N" note), or None."""
    for note in reversed(r.notes):
        if note.startswith("repeat ") and note[7:].isdigit():
            return int(note[7:])
    return None
