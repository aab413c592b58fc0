"""`retried` means one thing everywhere: records invoked more than once (the ledger's attempts > 1).
A start's summary counts the records it made so, live (RunStats.retried, what the job's store counts
as it starts them) and at the end (the ledger's growth over the start) alike, so the report merged
over every start of an output sums to the ledger's count. A record left in flight by two starts in a
row is counted once, by the first start that invoked it again. Real JobStore, real SQLite ledger and
output."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from forge.functions.store import open_store
from forge.stats import RunStats

N = 5


def _start(tmp_path, *, started: list[int], settled: list[int]) -> tuple[int, int, int]:
    """One start of the job: invoke `started`, settle `settled`, stop (what is not settled stays in
    flight). Returns (live count, the ledger's growth over this start, the ledger's count after
    it)."""
    opts = SimpleNamespace(input_path=tmp_path / "in.jsonl", output_path=tmp_path / "out.jsonl",
                           ledger_path=tmp_path / "out.jsonl.ledger.sqlite", restart=False,
                           accept_changed_function=False)
    stats = RunStats()
    store = open_store(
        opts, function_name="f", function_file=str(tmp_path / "fn.py"), node="test", stats=stats
    )

    async def work() -> None:
        async with store:
            for i in started:
                await store.started(i)
            for i in settled:
                await store.result(i, {"v": i})

    asyncio.run(work())
    after = store.counts().retried
    return stats.retried, after - store.retried_before, after


def test_a_start_counts_the_records_it_made_retried_once_each(tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(N)))
    (tmp_path / "fn.py").write_text("def f(r): return r\n")
    starts = [_start(tmp_path, started=[0, 1, 2], settled=[2]),    # 0 and 1 left in flight (killed)
              _start(tmp_path, started=[0], settled=[]),  # 0 again (retried now), in flight again
              # 0 a third time (counted), 1 again
              _start(tmp_path, started=[0, 1, 3, 4], settled=[0, 1, 3, 4])]
    assert [(live, grown) for live, grown, _ in starts] == [(0, 0), (1, 1), (1, 1)]
    # summed over starts: the ledger's count
    assert sum(live for live, _, _ in starts) == starts[-1][2] == 2
