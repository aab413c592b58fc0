"""Summarise a STEPLOG directory written by docs/bench/h200/exp/steptime (one line per generation loop, in the
order the loops ran): steps, seconds in step bodies and per step, the forward (with sampling and the device-to-host
copy) per step, the rest of the body (scheduling, batch tensors, update) per step, idle waits, q tokens per step.

    python docs/bench/steplog_summary.py STEPLOG_DIR
"""
import glob
import json
import os
import sys


def main(path: str) -> None:
    last = {}
    for f in sorted(glob.glob(os.path.join(path, "*.jsonl"))):
        for line in open(f):
            d = json.loads(line)
            last[(d["pid"], d["mgr"])] = d
    print("| pid | loop | steps | body s | ms/step | forward ms/step | rest ms/step | idle s (waits) | q tokens/step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in sorted(last.values(), key=lambda d: d["t"]):
        s = max(d["steps"], 1)
        print(f"| {d['pid']} | {d['mgr'] % 100000} | {d['steps']} | {d['step_s']:.2f} | {1000 * d['step_s'] / s:.1f} | "
              f"{1000 * d['fwd_s'] / s:.1f} | {1000 * (d['step_s'] - d['fwd_s']) / s:.1f} | "
              f"{d['idle_s']:.2f} ({d['idle_n']}) | {d['q'] / s:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1])
