"""Where a schedule's engine steps go: slots left empty, by phase, and what the last admitted requests asked for.

Reads the per-batch log of `docs/bench/cpu-proxy/exp/shapes` run with SHAPES_RAW=1 (<pid>.steps.jsonl: each batch's
query tokens, request count and the requests it admitted) and prints, per engine process, its steps and the
slot-steps it left empty (slots − requests in the batch, summed) in the first 25 steps, the middle and the last 30.
A schedule's extra steps over another on the same work show up as empty slot-steps; where they sit says why (a
ramp, refills, or the drain after the queue runs dry).

    python docs/bench/cpu-proxy/step_occupancy.py SHAPES_DIR [--slots 128] [--skip 16]

`--skip`: the batches before the bench's window (transformers' warm-up of the forge card and of direct; 16 for the
micro Llama tiers here). Processes with at most `--skip` + 30 batches (warm-ups only) are left out."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def summarize(rows: list[dict], slots: int) -> dict:
    empty = [slots - r["n"] for r in rows]
    admitted = [m for r in rows for _, _, m in r.get("new", [])]
    last_new = max((i for i, r in enumerate(rows) if r.get("new")), default=-1)
    return {"steps": len(rows), "empty_first25": sum(empty[:25]), "empty_middle": sum(empty[25:-30]),
            "empty_last30": sum(empty[-30:]), "empty_total": sum(empty),
            "query_tokens": sum(r["raw"][0] for r in rows), "drain_steps": len(rows) - last_new - 1,
            "last_admitted_max_new": admitted[-10:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes_dir", type=Path)
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--skip", type=int, default=16)
    args = ap.parse_args()
    for f in sorted(args.shapes_dir.glob("*.steps.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if len(rows) <= args.skip + 30:
            continue
        if "n" not in rows[0]:
            raise SystemExit(f"{f}: no request counts (an older log: run exp/shapes with SHAPES_RAW=1 again)")
        print(f.name, json.dumps(summarize(rows[args.skip:], args.slots)))


if __name__ == "__main__":
    main()
