"""Python's cyclic garbage collector, set for a process that moves many short-lived objects per
request.

A job allocates a handful of container objects per request (a coroutine and its frame, futures, the
request, its result tuple, the row) and frees nearly all of them by reference counting. The
collector still runs a generation-0 pass every 700 net allocations and, every tenth of those, a
generation-1 pass over everything that survived - with tens of thousands of requests in flight, most
of the node's live objects. Measured on the control-plane path (docs/benchmarks.md, "Control
plane"), that was about a third of the node process's CPU. So: what exists once the node is up
(modules, config, the node and its links) is frozen out of the collector, and a pass runs every
GEN0_THRESHOLD net allocations. Cycles are still collected, later; garbage without cycles is freed
at once as before."""
from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
_tuned = False


def tune_for_throughput() -> None:
    """Freeze what is alive now and collect less often. Idempotent; process-wide."""
    global _tuned
    if _tuned:
        return
    _tuned = True
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
