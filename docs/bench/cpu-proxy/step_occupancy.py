"""Where a schedule's engine steps go: slots left empty, by phase, and what the last admitted requests asked for.

Reads the per-batch log of `docs/bench/cpu-proxy/exp/shapes` run with SHAPES_RAW=1 (<pid>.steps.jsonl: each batch's
query tokens, request count and the requests it admitted) and prints, per engine process, its steps and the
slot-steps it left empty (slots − requests in the batch, summed) in the first 25 steps, the middle and the last 30.
A schedule's extra steps over another on the same work show up as empty slot-steps; where they sit says why (a
ramp, refills, or the drain after the queue runs dry).

    python docs/bench/cpu-proxy/step_occupancy.py SHAPES_DIR [--slots 128] [--skip 16] [--q-padding 64,128]

`--q-padding`: also count the CUDA-graph shapes first met after the skipped batches with the query tokens padded
to each of these (the KV and key paddings as exp/shapes keys them; the caps are the largest padded sizes in the
same process's graphs.jsonl, logged at transformers' preset paddings).

`--skip`: the batches before the bench's window (transformers' warm-up of the forge card and of direct; 16 for the
micro Llama tiers here). Processes with at most `--skip` + 30 batches (warm-ups only) are left out."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def summarize(rows: list[dict], slots: int) -> dict:
    empty = [slots - r["n"] for r in rows]
    admitted = [m for r in rows for _, _, m in r.get("new", [])]
    last_new = max((i for i, r in enumerate(rows) if r.get("new")), default=-1)
    return {"steps": len(rows), "empty_first25": sum(empty[:25]), "empty_middle": sum(empty[25:-30]),
            "empty_last30": sum(empty[-30:]), "empty_total": sum(empty),
            "query_tokens": sum(r["raw"][0] for r in rows), "drain_steps": len(rows) - last_new - 1,
            "last_admitted_max_new": admitted[-10:]}


def shapes_met(rows: list[dict], keys_logged: list[dict], q_padding: int, skip: int, kv_padding: int = 16384) -> int:
    """Distinct (query, KV read, longest key) shapes first met at or after batch `skip`, keyed as exp/shapes keys
    them but with the query padded to `q_padding`."""
    q_cap = max(k["key"][0] for k in keys_logged)
    kv_cap = max(k["key"][1] for k in keys_logged)
    key_cap = max(k["key"][2] for k in keys_logged)
    seen, met = set(), set()
    for i, r in enumerate(rows):
        q, kv, longest = r["raw"]
        key = (min(math.ceil(max(q, 1) / q_padding) * q_padding, q_cap),
               min(math.ceil(max(kv, 1) / kv_padding) * kv_padding, kv_cap),
               min(2 ** math.ceil(math.log2(max(longest, 1024))), key_cap))
        if i >= skip and key not in seen:
            met.add(key)
        seen.add(key)
    return len(met)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes_dir", type=Path)
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--skip", type=int, default=16)
    ap.add_argument("--q-padding", default="", help="comma-separated query paddings to count shapes under")
    args = ap.parse_args()
    paddings = [int(x) for x in args.q_padding.split(",") if x]
    logs = sorted(args.shapes_dir.glob("*.steps.jsonl"))
    if not logs:
        raise SystemExit(f"{args.shapes_dir}: no *.steps.jsonl (run exp/shapes with SHAPES=DIR SHAPES_RAW=1)")
    for f in logs:
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        if len(rows) <= args.skip + 30:
            continue
        if "n" not in rows[0]:
            raise SystemExit(f"{f}: no request counts (an older log: run exp/shapes with SHAPES_RAW=1 again)")
        out = summarize(rows[args.skip:], args.slots)
        if paddings:
            logged = [json.loads(line) for line in f.with_name(f.name.replace(".steps.", ".graphs.")).read_text()
                      .splitlines() if line.strip()]
            out["shapes"] = {p: shapes_met(rows, logged, p, args.skip) for p in paddings}
        print(f.name, json.dumps(out))


if __name__ == "__main__":
    main()
