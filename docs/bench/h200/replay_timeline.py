"""Replay a recorded scheduler timeline on a fresh transformers engine, without forge (docs/benchmarks.md, "The sixth
session on the H200").

    python docs/bench/h200/replay_timeline.py IN_PICKLE TIMELINE_JSONL RECORDS OUT_JSON

IN_PICKLE is a direct run's input written by `forge bench run --direct-process child` (its work/ folder: the plan,
the workload and the warm-up); TIMELINE_JSONL is one process's log from exp/timeline (what entered the scheduler at
which step). The last RECORDS entries of the log are the measured run's. The engine is built exactly as the direct
mode builds it (forge.bench.direct.DirectEngine) and warmed the same way; then the generation loop itself takes
each recorded request at the step it was taken in the recorded run (so neither a feeding thread nor forge's timing
is involved), and the window runs from the first request to the last result. If the engine runs out of work before
the next recorded step (the recorded run idled there), the next requests enter at once. Replaying forge's card
worker's timeline times forge's schedule at the direct mode's cost per step; replaying the direct run's own
timeline checks the replay against the direct run."""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
import pickle

from forge.bench.direct import DirectEngine, _count_prefix_hits, _feed

STALL_LIMIT_S = 120.0


def load_timeline(path: str, records: int) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    rows = rows[-records:]
    if len(rows) < records:
        raise SystemExit(f"{path}: {len(rows)} entries, fewer than the {records} records asked for")
    return rows


def replay(eng: DirectEngine, rows: list[dict], warmup) -> dict:
    from transformers.generation.continuous_batching import continuous_api as api

    first = rows[0]["step"]
    due: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        due[r["step"] - first].append(r)
    order = sorted(due)
    m = eng.manager()
    hits = _count_prefix_hits(m.batch_processor.cache) if m.batch_processor is not None else [0]
    m.start()
    state = dict(base=None, next=0)
    drain = api.drain_queue

    def add(group: list[dict]) -> None:
        for r in group:
            m.add_request(r["prompt"], request_id=r["id"], max_new_tokens=r["max_new"], eos_token_id=eng.eos_arg,
                          **eng.request_kwargs)

    def injecting_drain(q):
        got = drain(q)
        if state["base"] is None or q is not m.input_queue or state["next"] >= len(order):
            return got
        step = m.current_batch - state["base"]
        bp = m.batch_processor
        idle = not got and bp is not None and not bp.scheduler.has_pending_requests()
        took = False
        while state["next"] < len(order) and (order[state["next"]] <= step or (idle and not took)):
            add(due[order[state["next"]]])
            state["next"] += 1
            took = True
        return got + drain(q) if took else got

    api.drain_queue = injecting_drain
    try:
        if warmup:
            _feed(m, list(warmup), None, eng, "warm")
            hits[0] = 0
        want = {r["id"]: r for r in rows}
        inp = out = 0
        t0, started_at = time.perf_counter(), time.time()
        state["base"] = m.current_batch
        m._wake_up_loop.set()
        last = t0
        while want:
            res = m.get_result(timeout=0.5)
            now = time.perf_counter()
            if res is None:
                if not m.is_running() or now - last > STALL_LIMIT_S:
                    raise SystemExit(f"{len(want)} request(s) never finished")
                continue
            if not res.is_finished() or res.request_id not in want:
                continue
            last = now
            r = want.pop(res.request_id)
            toks = res.generated_tokens
            inp += len(r["prompt"])
            out += len(toks) - (1 if toks and toks[-1] in eng.eos_set else 0)
        window = last - t0
        return dict(window_s=round(window, 3), started_at=round(started_at, 3), steps=m.current_batch - state["base"], requests=len(rows),
                    input_tokens=inp, output_tokens=out, tok_s=round((inp + out) / window, 1),
                    prefix_hit_tokens=hits[0], groups=len(order))
    finally:
        api.drain_queue = drain
        m.stop(block=True, timeout=30, hard_stop=True)
        m.destroy()


def main(in_pickle: str, timeline: str, records: str, out_json: str) -> None:
    plan, _requests, _variant, warmup, *_ = pickle.loads(Path(in_pickle).read_bytes())
    rows = load_timeline(timeline, int(records))
    eng = DirectEngine(plan)
    try:
        result = replay(eng, rows, warmup)
    finally:
        eng.close()
    result.update(timeline=timeline)
    Path(out_json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: replay_timeline.py IN_PICKLE TIMELINE_JSONL RECORDS OUT_JSON")
    for path in sys.argv[1:3]:
        if not Path(path).is_file():
            raise SystemExit(f"replay_timeline.py: {path}: no such file")
    if not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
        raise SystemExit(f"replay_timeline.py: RECORDS must be a positive whole number, got {sys.argv[3]!r}")
    main(*sys.argv[1:5])
