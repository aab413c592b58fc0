"""A real run without an engine, for the kill -9 test: records -> a pure function -> ledger +
output.

usage: _driver.py INPUT OUTPUT GEN_LOG RUN_ID [SLOW_WRITE_S] SLOW_WRITE_S makes every output write
that much slower (a slow disk), so that random kills also land between a ledger commit and the
output write. Every generation is logged to GEN_LOG ("RUN_ID INDEX") before its result is handed to
the ledger, so the test can prove that nothing already settled is ever generated again."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict

from forge.ledger import make_run_key, open_run
from forge.records import InputError, OutputWriter, open_records

CONCURRENCY = 16


def pure(record: dict) -> dict:
    """The 'function': deterministic in the record; every 7th id raises."""
    if record["id"] % 7 == 3:
        raise ValueError(f"id {record['id']} is unlucky")
    digest = hashlib.sha256(record["text"].encode()).hexdigest()[:16]
    return {"id": record["id"], "digest": digest, "len": len(record["text"])}


def delay_s(index: int) -> float:
    """Completion out of input order: 2-20 ms, fixed per index."""
    return 0.002 + (index * 7919 % 19) / 1000


async def main(input_path: str, output: str, gen_log: str, run_id: str) -> None:
    source = open_records(input_path)
    key = make_run_key(function_file=__file__, function_name="pure", source=source)
    run = open_run(output, run_key=key, total=source.count())
    print("ready", json.dumps(asdict(run.report)), flush=True)   # what resuming found and did
    log_fd = os.open(gen_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    slots = asyncio.Semaphore(CONCURRENCY)
    tasks: set[asyncio.Task] = set()

    async def one(index: int, record: dict | InputError) -> None:
        try:
            if isinstance(record, InputError):
                await run.aput_error(index, record.type, record.message)
                return
            await run.aput_attempt(index)
            os.write(log_fd, f"{run_id} {index}\n".encode())
            await asyncio.sleep(delay_s(index))
            try:
                result = pure(record)
            except ValueError as e:
                await run.aput_error(index, type(e).__name__, str(e))
                return
            await run.aput_result(index, result)
        finally:
            slots.release()

    try:
        for index, record in source.records(skip=run.is_settled):
            await slots.acquire()
            task = asyncio.create_task(one(index, record))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    # Ctrl-C (the main task is cancelled): stop the producers, then drain what they handed over
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        report = run.close()
    print("done", json.dumps(asdict(report)), flush=True)


def slow_disk(seconds: float) -> None:
    real_append = OutputWriter.append

    def append(self: OutputWriter, lines: list[str]) -> int:
        time.sleep(seconds)
        return real_append(self, lines)

    OutputWriter.append = append


if __name__ == "__main__":
    if len(sys.argv) > 5:
        slow_disk(float(sys.argv[5]))
    try:
        asyncio.run(main(*sys.argv[1:5]))
    except KeyboardInterrupt:
        sys.exit(130)
