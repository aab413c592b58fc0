"""Measure the ledger: rows/s committed batched vs one transaction per row, and the whole write
path (encode -> queue -> commit -> write + fsync -> mark written). Not collected by pytest.

    /work/venv/bin/python tests/ledger/bench_ledger.py [ROWS] [DIR]
"""
from __future__ import annotations

import asyncio
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

from forge import constants
from forge.ledger import Ledger, open_run
from forge.records import encode_result

KEY = {"bench": 1}


def result(i: int) -> dict:
    return {"id": i, "summary": f"summary of record {i} " + "lorem ipsum " * 12, "tokens": 64}


def per_row(path: Path, rows: int, synchronous: str = "NORMAL") -> float:
    led = Ledger(path, run_key=KEY)
    led._db.execute(f"PRAGMA synchronous={synchronous}")
    lines = [encode_result(i, result(i))[0] for i in range(rows)]
    start = time.perf_counter()
    for i, line in enumerate(lines):
        led.apply(settled=[(i, line, False)])
    for i in range(rows):
        led.apply(written=[(i, False)])
    elapsed = time.perf_counter() - start
    led.close()
    return rows / elapsed


def batched(path: Path, rows: int, batch: int = constants.LEDGER_COMMIT_MAX_ROWS) -> float:
    led = Ledger(path, run_key=KEY)
    lines = [encode_result(i, result(i))[0] for i in range(rows)]
    start = time.perf_counter()
    prev: list = []
    # the committer's pattern: settle this batch, mark the last one
    for lo in range(0, rows, batch):
        chunk = [(i, lines[i], False) for i in range(lo, min(rows, lo + batch))]
        led.apply(settled=chunk, written=prev)
        prev = [(i, False) for i, _, _ in chunk]
    led.apply(written=prev)
    elapsed = time.perf_counter() - start
    led.close()
    return rows / elapsed


def pipeline(out: Path, rows: int, producers: int = 2) -> tuple[float, object]:
    run = open_run(out, run_key=KEY, total=rows)
    start = time.perf_counter()

    async def produce_async(k: int) -> None:
        for i in range(k, rows, producers):
            await run.aput_attempt(i)
            await run.aput_result(i, result(i))

    def produce(k: int) -> None:
        asyncio.run(produce_async(k))

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.close()
    return rows / (time.perf_counter() - start), run.stats


def pipeline_async(out: Path, rows: int, concurrency: int = 256) -> float:
    run = open_run(out, run_key=KEY, total=rows)

    async def main() -> None:
        async def one(i: int) -> None:
            await run.aput_attempt(i)
            await run.aput_result(i, result(i))
        for lo in range(0, rows, concurrency):
            await asyncio.gather(*(one(i) for i in range(lo, min(rows, lo + concurrency))))

    start = time.perf_counter()
    asyncio.run(main())
    run.close()
    return rows / (time.perf_counter() - start)


def resume_open(out: Path, rows: int) -> float:
    start = time.perf_counter()
    run = open_run(out, run_key=KEY, total=rows)
    assert run.report.complete
    run.close()
    return time.perf_counter() - start


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    base = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        d = Path(d)
        full_rows = min(rows, 2000)
        res = {
            "one transaction per change (settle, then mark written), synchronous=NORMAL": (
                rows,
                per_row(d / "a.sqlite", rows),
            ),
            "one transaction per change, synchronous=FULL": (
                full_rows,
                per_row(d / "f.sqlite", full_rows, "FULL"),
            ),
            f"batched, {constants.LEDGER_COMMIT_MAX_ROWS} rows per transaction (settle + mark "
            "written)": (rows, batched(d / "b.sqlite", rows)),
        }
        rate, stats = pipeline(d / "out.jsonl", rows)
        res["whole write path, 2 producer threads, a loop each (aput_result)"] = (rows, rate)
        res["whole write path, asyncio (aput_result)"] = (
            rows,
            pipeline_async(d / "out2.jsonl", rows),
        )
        opened = resume_open(d / "out.jsonl", rows)
    print(f"{time.strftime('%Y-%m-%d')} {platform.node()} python {platform.python_version()} "
          f"sqlite {__import__('sqlite3').sqlite_version}")
    print("| what | rows | rows/s |\n| --- | ---: | ---: |")
    for name, (n, r) in res.items():
        print(f"| {name} | {n} | {r:,.0f} |")
    print(f"\npipeline commits: {stats.commits}, mean commit "
          f"{stats.total_commit_s / max(1, stats.commits) * 1e3:.2f} ms, "
          f"rows per commit {stats.rows_committed / max(1, stats.commits):.0f}")
    print(f"resume open of the complete {rows}-row run (reconcile + ledger scan): {opened:.2f} s")
    print(json.dumps({k: round(v[1]) for k, v in res.items()}))


if __name__ == "__main__":
    main()
