"""CPU seconds of each thread inside each run's window, from the threadcpu experiment's logs
(docs/bench/cpu-proxy/exp/threadcpu): python docs/bench/threadcpu_summary.py THREADLOG_DIR bench.json

The logs are one sample a second, so a window's figures are the difference between the last sample before its
start and the first after its end (up to a second of work either side of the window is counted); a process that exited before its next sample
is counted to its last one."""
from __future__ import annotations

import glob
import json
import os
import sys


def main(logdir: str, bench_json: str) -> None:
    runs = json.load(open(bench_json))["results"]
    series = {}
    for path in glob.glob(os.path.join(logdir, "*.jsonl")):
        lines = [json.loads(x) for x in open(path) if x.strip()]
        if lines:
            series[lines[0]["pid"]] = lines
    for r in runs:
        t0, t1 = r["started_at"], r["started_at"] + r["window_s"]
        print(f"## {r['mode']} {r['variant']} window {r['window_s']:.2f} s")
        for pid, lines in sorted(series.items()):
            before = [x for x in lines if x["t"] <= t0]
            after = [x for x in lines if x["t"] >= t1] or [x for x in lines if x["t"] > t0][-1:]   # it exited
            if not before or not after:
                continue
            a, b = before[-1], after[0]
            span = b["t"] - a["t"]
            rows = sorted(((b["threads"][k] - a["threads"].get(k, 0.0), k) for k in b["threads"]), reverse=True)
            rows = [(s, k) for s, k in rows if s > 0]
            if not rows:
                continue
            print(f"  pid {pid} ({lines[0]['argv0']}), {span:.1f} s sampled:")
            for s, k in rows:
                print(f"    {s:7.2f} s  {100 * s / span:5.1f} %  {k}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
