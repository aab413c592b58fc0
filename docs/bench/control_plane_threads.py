"""Where the node process's CPU goes by thread in `forge bench control-plane` (docs/benchmarks.md, "Cutting the
node's CPU per task"): the event loop (main thread: functions, node, broker, link), the ledger's committer thread
(SQLite + output writes) and the reader's pool threads (JSONL parsing), each by its own thread CPU clock.

    python docs/bench/control_plane_threads.py [--records 50000]

Run it with PYTHONPATH at the checkout to measure. The main thread's figure includes setup (building the records
file, starting the node); the window's CPU is what the bench itself reports."""
from __future__ import annotations

import argparse
import concurrent.futures.thread as pool_thread
import tempfile
import time
from pathlib import Path

import forge.ledger.committer as committer

spent: dict[str, list[float]] = {"committer": [], "reader pool": []}


def clocked(fn, name: str):
    def run(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name].append(time.thread_time() - t0)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=50_000)
    args = ap.parse_args()
    committer.Committer._run = clocked(committer.Committer._run, "committer")
    pool_thread._worker = clocked(pool_thread._worker, "reader pool")   # threads started from here on
    from forge.bench.control_plane import run_control_plane

    m0 = time.thread_time()
    with tempfile.TemporaryDirectory() as work:
        run = run_control_plane(Path(work), records=args.records, core=0, repeat=1)["runs"][0]
        main_s = time.thread_time() - m0     # asyncio.run ended the loop's pool: its threads are counted
    print(f"window CPU {run['cpu_s']:.3f} s, {run['requests_per_cpu_s']:,.0f} tasks per CPU-s; main thread "
          f"{main_s:.3f} s (with setup); committer {sum(spent['committer']):.3f} s; "
          f"reader pool {sum(spent['reader pool']):.3f} s")


if __name__ == "__main__":
    main()
