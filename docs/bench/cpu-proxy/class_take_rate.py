"""The broker's take rate for one engine at each output-class width (docs/benchmarks.md, "The eighth session"):
tests/broker/bench_core.py's workload (64 prompt families, 8-128 new tokens) through a one-engine BrokerCore kept
~4,000 deep, takes of 16, every request done at once; requests per CPU-second of this process.

    python docs/bench/cpu-proxy/class_take_rate.py [--records 40000] [--repeat 3] [--bits 0,2,5]
"""
from __future__ import annotations

import argparse
import sys
import time

sys.path.insert(0, ".")

from forge.broker import BrokerCore, EngineGeometry  # noqa: E402
from tests.broker.bench_core import SHAPES, workload  # noqa: E402

DEPTH, TAKE = 4000, 16


def rate(bits: int, shape: str, n: int) -> float:
    reqs = workload(n, seed=1)
    core = BrokerCore([EngineGeometry("gpu0", "tok", max_input_len=384, max_output_len=128, **SHAPES[shape])],
                      grouping=True)
    core._pending.class_bits = bits
    k = done = 0
    t0 = time.process_time()
    while done < n:
        while k < n and core.pending() < DEPTH:
            core.add(reqs[k])
            k += 1
        batch = core.take("gpu0", free_slots=TAKE, free_kv_blocks=10**6)
        for r in batch:
            core.on_done("gpu0", r)
        done += len(batch)
    return n / (time.process_time() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bits", default="0,2,5")
    args = ap.parse_args()
    bits = [int(b) for b in args.bits.split(",")]
    for shape in SHAPES:
        for rep in range(args.repeat):
            print(shape, rep + 1, {b: round(rate(b, shape, args.records)) for b in bits})


if __name__ == "__main__":
    main()
