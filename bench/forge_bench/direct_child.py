"""The direct mode in a fresh process (`forge bench run --direct-process child`).

By default the direct mode builds its model once in the bench's own process and runs every variant
and repeat there, while every forge run starts a fresh card worker process. With `child`, each
direct run starts its own process (`python -m forge_bench.direct_child IN OUT`): the same plan,
requests and warm-up, the model built there, the run's ModeResult sent back. So both modes run in a
process of their own that was started for the run, and the bench's process holds no model or CUDA
memory while forge runs: what is left between the modes is what forge adds (docs/benchmarks.md, "The
tool"). A card that names its cores (cards[].cores) always runs its direct mode here, the process
bound to them from its start as the card worker is. Bounded by CHILD_LIMIT_S; the child dies with
the bench."""
from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path
from typing import Sequence

from forge.config.plan import CardPlan
from forge.errors import ForgeError
from forge_bench.child import ChildProcess, last_line
from forge_bench.results import ModeResult
from forge_bench.workload import BenchRequest

CHILD_LIMIT_S = 1800.0          # one direct run in its process, model build included


def run_direct_in_child(plan: CardPlan, requests: Sequence[BenchRequest], variant: str, *,
                        warmup: Sequence[BenchRequest], workdir: Path, tag: str,
                        warm_jobs: Sequence[Sequence[BenchRequest]] = (),
                        limit_s: float = CHILD_LIMIT_S) -> ModeResult:
    """One direct run (one variant) in a new process; its ModeResult, noted with the child's pid and
    build time."""
    workdir.mkdir(parents=True, exist_ok=True)
    inp, out, log = (workdir / f"direct-{tag}.{ext}" for ext in ("in.pickle", "out.pickle", "log"))
    out.unlink(missing_ok=True)
    inp.write_bytes(
        pickle.dumps(
            (plan, list(requests), variant, list(warmup), [list(j) for j in warm_jobs]), protocol=5
        )
    )
    rc, wall, cut = ChildProcess(
        [sys.executable, "-m", "forge_bench.direct_child", str(inp), str(out)], log
    ).wait(limit_s)
    if cut or rc != 0 or not out.is_file():
        why = f"cut at its {limit_s:g} s limit" if cut else f"exit code {rc}"
        raise ForgeError(f"direct {variant} in a child process failed ({why}; log {log}): "
                         f"{last_line(log)}")
    result, pid, build_s = pickle.loads(out.read_bytes())
    result.notes.append(f"own process (pid {pid}; model built in {build_s:.1f} s)")
    return result


def main(inp: str, out: str) -> None:
    plan, requests, variant, warmup, warm_jobs = pickle.loads(Path(inp).read_bytes())
    if plan.card.cores and hasattr(os, "sched_setaffinity"):
        # The card's cores, before torch or the engine is imported (as the card worker binds
        # itself): OpenMP sizes its team from the cores the process may use when it starts.
        os.sched_setaffinity(0, set(plan.card.cores))
    from forge.host.lifeline import die_with_parent
    from forge_bench.direct import direct_engine

    die_with_parent()
    t0 = time.perf_counter()
    engine = direct_engine(plan)
    build_s = time.perf_counter() - t0
    try:
        result = engine.run(requests, variant, warmup=warmup, warm_jobs=warm_jobs)
    finally:
        engine.close()
    tmp = Path(out + ".tmp")
    tmp.write_bytes(pickle.dumps((result, os.getpid(), build_s), protocol=5))
    tmp.replace(out)                 # whole or absent: the parent never reads half a result


if __name__ == "__main__":
    main(*sys.argv[1:3])
