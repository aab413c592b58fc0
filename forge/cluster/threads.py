"""The CPU threads an engine actor's card has, given to its engine.

Ray starts an actor's worker with OMP_NUM_THREADS set to the actor's `num_cpus` (1 when it asks for
none), so a CPU engine in an actor ran on one OpenMP thread: 3.6x slower than the same card under
`forge run`, silently (issue 50). The card's threads are its own cores (`cards[].cores`) when it
names them, else the cores the node may use (`host.cpu_cores`), as a card worker of a node on one
machine has them. The actor binds itself to the named cores, sets OMP_NUM_THREADS (read by the
engine's libraries when they load, and inherited by any process the engine starts) and torch's
intra-op threads, and reports what it got: the agent prints a warning when it is fewer than the card
has. The agent asks Ray for the same number of CPUs for a CPU card (cpu_reservations), so Ray's
accounting agrees with what the engine runs."""
from __future__ import annotations

import os
import sys
from typing import Optional

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def card_threads(plan, host_cores: int) -> int:
    """How many threads the card's engine should run: its named cores, else the node's."""
    return len(set(plan.card.cores)) if plan.card.cores else host_cores


def allowed_cores() -> Optional[set[int]]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def give_threads(plan, host_cores: int) -> dict:
    """Bind this process to the card's cores (when named) and set its thread count, before the
    engine loads. Returns {"wanted", "threads", "cores", "problems"}: problems says why threads <
    wanted, in words."""
    wanted = card_threads(plan, host_cores)
    problems: list[str] = []
    if plan.card.cores and hasattr(os, "sched_setaffinity"):
        try:  # before the engine's threads start: threads inherit the binding when made
            os.sched_setaffinity(0, set(plan.card.cores))
        except OSError as e:
            problems.append(f"cannot bind to cores {sorted(set(plan.card.cores))}: "
                            f"{e.strerror or e}")
    allowed = allowed_cores()
    threads = wanted if allowed is None else min(wanted, len(allowed))
    if threads < wanted:
        problems.append(f"this Ray worker may run on {len(allowed or ())} core(s) only "
                        f"({sorted(allowed or ())})")
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    torch_threads = set_torch_threads(threads)
    if torch_threads is not None and torch_threads != threads:
        problems.append(f"torch runs {torch_threads} thread(s)")
    return {"wanted": wanted, "threads": threads if torch_threads is None else torch_threads,
            "cores": sorted(allowed) if allowed is not None else None, "problems": problems}


def set_torch_threads(n: int) -> Optional[int]:
    """torch's intra-op threads, where torch is loaded or installed (None where it is not
    installed)."""
    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401 - loaded now so that the count is set before the engine runs
        except ImportError:
            return None
    torch = sys.modules["torch"]
    torch.set_num_threads(n)
    return torch.get_num_threads()


def current_threads() -> dict:
    """What this process runs now (the actor's `threads` call): OMP_NUM_THREADS, torch's count, its
    cores."""
    torch = sys.modules.get("torch")
    allowed = allowed_cores()
    return {"omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "cores": sorted(allowed) if allowed is not None else None}


def cpu_reservations(
    plans, host_cores: int, node_cpus: float
) -> tuple[dict[str, float], list[str]]:
    """The Ray CPUs each card's actor asks for: a CPU card its threads, a GPU card none (its
    engine's CPU work is light, and Ray's CPUs stay free for other work). Where the Ray node has
    fewer CPUs than the CPU cards' threads, each card gets what is left and a warning says so: the
    engine still runs its threads (Ray's CPUs are accounting, not a binding), but an actor that
    asked for more than the node has would never be placed."""
    out: dict[str, float] = {}
    warnings: list[str] = []
    wanted = {p.card_id: float(card_threads(p, host_cores)) for p in plans if p.card.kind == "cpu"}
    left = float(node_cpus)
    for p in plans:
        want = wanted.get(p.card_id, 0.0)
        out[p.card_id] = min(want, max(left, 0.0))
        left -= out[p.card_id]
        if out[p.card_id] < want:
            warnings.append(f"card {p.card_id}: its Ray node has {node_cpus:g} CPU(s) for "
                            f"{sum(wanted.values()):g} "
                            f"CPU-card thread(s); the engine actor reserves {out[p.card_id]:g} of "
                            f"its {want:g} "
                            f"(its engine still runs {want:g} threads; give the Ray node "
                            "--num-cpus "
                            f"{sum(wanted.values()):g} to make Ray count them)")
    return out, warnings
