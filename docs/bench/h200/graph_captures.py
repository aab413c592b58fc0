"""CUDA graph captures inside and outside each measured window (docs/benchmarks.md, "The seventh session on the H200").

    python docs/bench/h200/graph_captures.py TIMELINE_DIR [BENCH_JSON | REPLAY_JSON ...]

TIMELINE_DIR holds exp/timeline's <pid>.graphs.jsonl (one line per capture: wall clock at its end, step, padded
shape, seconds). Windows come from a bench.json's runs (started_at, window_s) and from replay_timeline.py's outputs
(started_at, window_s). Prints, per window, the captures that ended inside it and their seconds, then what fell
outside every window (load-time warm-ups, the bench's warm-up requests)."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def windows(paths: list[str]) -> list[tuple[str, float, float]]:
    out = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        if "results" in data:
            for i, r in enumerate(data["results"]):
                if r.get("started_at") is not None:
                    label = f"{Path(p).parent.name}:{i + 1}:{r['mode']}:{r.get('variant') or ''}"
                    out.append((label, r["started_at"], r["started_at"] + r["window_s"]))
        elif data.get("started_at") is not None:
            out.append((Path(p).stem, data["started_at"], data["started_at"] + data["window_s"]))
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 1 or not Path(argv[0]).is_dir():
        raise SystemExit("usage: graph_captures.py TIMELINE_DIR [BENCH_JSON | REPLAY_JSON ...]")
    caps = []
    for f in sorted(Path(argv[0]).glob("*.graphs.jsonl")):
        caps += [dict(json.loads(line), pid=f.name.split(".")[0]) for line in f.read_text().splitlines() if line]
    wins = windows(argv[1:])
    used = set()
    print("| window | captures | capture s | distinct shapes |\n| --- | ---: | ---: | ---: |")
    for label, a, b in wins:
        inside = [c for c in caps if a <= c["t"] <= b]
        used.update(id(c) for c in inside)
        shapes = {tuple(c["key"] or ()) for c in inside}
        print(f"| {label} | {len(inside)} | {sum(c['s'] for c in inside):.2f} | {len(shapes)} |")
    rest = [c for c in caps if id(c) not in used]
    print(f"| outside every window | {len(rest)} | {sum(c['s'] for c in rest):.2f} | "
          f"{len({tuple(c['key'] or ()) for c in rest})} |")


if __name__ == "__main__":
    main(sys.argv[1:])
