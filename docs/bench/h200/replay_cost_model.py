"""Each replayed schedule's time at one machine speed (docs/benchmarks.md, "The sixth session on the H200").

    python docs/bench/h200/replay_cost_model.py REPLAY_DIR [REPLAY_DIR...] [--predict RUN_DIR...]

A REPLAY_DIR holds replay-N-NAME.json files (docs/bench/h200/replay_timeline.py) and the step timer's log of the
same replays (replay-steplog/, else steplog/; one file per replay process, in start order). On the H200 VM one
CPU-bound thread's speed changes from run to run and within a run (a pure-decode step: 82-115 ms), so replay
windows mix the schedule with the machine. This fits one cost per step from the steps taken while the machine
was fast (the median pure-decode step within 20 steps of it at most FAST_MS) — ms = a + b*q + c*[q > 128] +
d*[q < 128] + e*max(q - 2048, 0), q the step's tokens — and prints each schedule's predicted total. A model of q
alone: it does not see how many requests a step prefills or how long their contexts are.

--predict: runs recorded anywhere with TIMELINE and STEPLOG set (e.g. on the CPU tier with the 1.5B's scheduling
geometry, docs/bench/cpu-proxy/node-cpu-llama-micro-g1p5b.yaml), RUN_DIR holding timeline/ and steplog/: each
recording process's steps from its last RECORDS requests' first step on, priced with the same fit — what that
schedule would take on the H200 at its fast speed (the steps a schedule takes do not depend on the machine)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

FAST_MS = 90.0
NEAR = 20


def features(q: np.ndarray) -> np.ndarray:
    return np.c_[np.ones_like(q), q, q > 128, q < 128, np.maximum(q - 2048, 0)]


def steps_of(log: Path) -> list:
    """Every step the step timer wrote to one process's log, in order: [start, body s, forward s, q tokens]."""
    return [s for line in log.read_text().splitlines() for s in json.loads(line)["recent"]]


def runs_of(folder: Path) -> list[tuple[str, np.ndarray]]:
    reps = sorted(folder.glob("replay-*.json"), key=lambda p: int(p.name.split("-")[1]))
    logs = next((d for d in (folder / "replay-steplog", folder / "steplog") if d.is_dir()), None)
    if not reps or logs is None:
        raise SystemExit(f"{folder}: no replay-N-NAME.json files or no replay-steplog/ (or steplog/) beside them")
    files = sorted(logs.glob("*.jsonl"), key=lambda p: json.loads(p.read_text().splitlines()[0])["t"])
    out = []
    for rep, log in zip(reps, files):
        steps = json.loads(rep.read_text())["steps"]
        out.append((f"{folder.name}/{rep.stem.split('-', 2)[2]}", np.array(steps_of(log)[-steps:], dtype=float)))
    return out


def fast_steps(r: np.ndarray) -> np.ndarray:
    q, ms = r[:, 3], r[:, 1] * 1000
    decode = np.where(q == 128)[0]
    keep = []
    for i in range(len(q)):
        near = decode[np.abs(decode - i) <= NEAR]
        keep.append(len(near) >= 3 and np.median(ms[near]) <= FAST_MS)
    return np.array(keep)


def recorded(run_dir: Path, records: int = 512) -> list[tuple[str, np.ndarray]]:
    out = []
    for tl in sorted((run_dir / "timeline").glob("*.jsonl")):
        lines = tl.read_text().splitlines()
        if len(lines) < records:
            continue
        first = json.loads(lines[-records])["step"]
        log = run_dir / "steplog" / tl.name
        if not log.is_file():
            raise SystemExit(f"{log}: no step log for {tl} (record with STEPLOG and TIMELINE both set)")
        rows = steps_of(log)
        cmd = tl.with_suffix(".cmd").read_text() if tl.with_suffix(".cmd").is_file() else ""
        kind = "forge worker" if "forge.host" in cmd else "direct" if "direct_child" in cmd else "process"
        out.append((f"{run_dir.name}/{kind} {tl.stem}", np.array(rows[first:], dtype=float)))
    return out


def main(args: list[str]) -> None:
    cut = args.index("--predict") if "--predict" in args else len(args)
    folders, predict = args[:cut], args[cut + 1:]
    runs = [run for f in folders for run in runs_of(Path(f))]
    xs, ys = [], []
    for _, r in runs:
        keep = fast_steps(r)
        xs.append(features(r[keep, 3]))
        ys.append(r[keep, 1] * 1000)
    x, y = np.vstack(xs), np.concatenate(ys)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    print(f"fitted on {len(y)} steps taken while fast; ms = " + " + ".join(f"{c:.4g}·{n}" for c, n in zip(
        coef, ("1", "q", "[q>128]", "[q<128]", "max(q-2048,0)"))) + f"; residual sd {np.std(y - x @ coef):.1f} ms")
    seen = set()
    for name, r in runs:
        if name in seen:
            continue
        seen.add(name)
        measured = ", ".join(f"{rr[:, 1].sum():.2f}" for n, rr in runs if n == name)
        print(f"{name:40s} {len(r):4d} steps  predicted {float((features(r[:, 3]) @ coef).sum()) / 1000:6.2f} s"
              f"  (step bodies as measured: {measured} s)")
    for run_dir in predict:
        for name, r in recorded(Path(run_dir)):
            print(f"{name:40s} {len(r):4d} steps  predicted {float((features(r[:, 3]) @ coef).sum()) / 1000:6.2f} s")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] == "--predict":
        raise SystemExit("usage: replay_cost_model.py REPLAY_DIR [REPLAY_DIR...] [--predict RUN_DIR...]")
    main(sys.argv[1:])
