"""Summarise a STEPLOG directory written by docs/bench/h200/exp/steptime.

    python docs/bench/steplog_summary.py STEPLOG_DIR [BENCH_JSON]

One line per generation loop, in the order the loops ran: steps, seconds in step bodies and per step, the forward
(with sampling and the device-to-host copy) per step, the rest of the body (scheduling, batch tensors, update) per
step, idle waits, q tokens per step. With the run's bench.json, a second table cuts the steps to each run's window
(its started_at .. started_at + window_s): the steps inside it, their body, forward and rest per step, and the
window's time outside step bodies (the engine idle or between steps)."""
import glob
import json
import os
import sys


def loops(path: str) -> list[dict]:
    last, steps = {}, {}
    for f in sorted(glob.glob(os.path.join(path, "*.jsonl"))):
        for line in open(f):
            d = json.loads(line)
            key = (d["pid"], d["mgr"])
            last[key] = d
            steps.setdefault(key, []).extend(d.get("recent", []))
    out = []
    for key, d in last.items():
        out.append(dict(d, all_steps=steps.get(key, [])))
    return sorted(out, key=lambda d: d["t"])


def totals(ls: list[dict]) -> None:
    print("| pid | loop | steps | body s | ms/step | forward ms/step | rest ms/step | idle s (waits) | q tokens/step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in ls:
        s = max(d["steps"], 1)
        print(f"| {d['pid']} | {d['mgr'] % 100000} | {d['steps']} | {d['step_s']:.2f} | {1000 * d['step_s'] / s:.1f} | "
              f"{1000 * d['fwd_s'] / s:.1f} | {1000 * (d['step_s'] - d['fwd_s']) / s:.1f} | "
              f"{d['idle_s']:.2f} ({d['idle_n']}) | {d['q'] / s:.0f} |")


def windows(ls: list[dict], bench_json: str) -> None:
    runs = json.load(open(bench_json))["results"]
    every = [st for d in ls for st in d["all_steps"]]
    print()
    print("| run | window s | steps in it | body ms/step | forward ms/step | rest ms/step | outside step bodies s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in runs:
        t0 = r.get("started_at")
        if t0 is None:
            continue
        w = r["window_s"]
        inside = [st for st in every if t0 <= st[0] <= t0 + w]
        n = max(len(inside), 1)
        body, fwd = sum(st[1] for st in inside), sum(st[2] for st in inside)
        name = f"{r['mode']} {r['variant']} {(r.get('notes') or [''])[-1]}".strip()
        print(f"| {name} | {w:.2f} | {len(inside)} | {1000 * body / n:.1f} | {1000 * fwd / n:.1f} | "
              f"{1000 * (body - fwd) / n:.1f} | {w - body:.2f} |")


if __name__ == "__main__":
    found = loops(sys.argv[1])
    totals(found)
    if len(sys.argv) > 2:
        windows(found, sys.argv[2])
