"""Feed transformers' own API (the bench's direct mode) in given orders, to tell forge's order from its feeding.

    ORDERLOG=/tmp/order.jsonl PYTHONPATH=docs/bench/cpu-proxy/exp/order forge bench run WORKLOAD --node NODE \
        --records N --modes forge --card-transport thread --out DIR
    python docs/bench/cpu-proxy/replay_order.py WORKLOAD NODE N /tmp/order.jsonl 128,all

runs each order below at each depth (requests kept in the engine; `all` = everything at once) and prints the
engine steps it took: the order forge handed its engine (from the log), the workload sorted by output classes of
a power of two, of a half and of a quarter of one (arrival order within a class), and sorted by exact length
(direct's `longest`). The bench's warm-up requests come first in the log (one per bench warm-up request).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from forge.bench.direct import DirectEngine, _feed
from forge.bench.modes import single_card, warmup_requests
from forge.bench.workload import generate, load_workload
from forge.config.load import load_node

WARMUP = 8          # forge bench's warm-up requests (its default)


def output_class(n: int, bits: int) -> int:
    """max_new_tokens in classes of 2**-bits of a power of two (bits 0: the power of two alone)."""
    top = n.bit_length()
    return (top << bits) | (((n << bits) >> (top - 1)) & ((1 << bits) - 1)) if top else 0


def forge_order(log: str, n_warm: int, n: int) -> list[int]:
    """Workload indices in the order the log's engine was handed them (record ids end in the hex record index;
    the warm-up requests took the first indices)."""
    rows = [json.loads(line) for line in open(log)][n_warm:]
    prefix = rows[0][1].split("|")[0].split("-")[0]          # the job's id: "<job>-1|<job><hex index>|..."
    idx = [int(r[1].split("|")[1][len(prefix):], 16) - n_warm for r in rows]
    if sorted(idx) != list(range(n)):
        raise SystemExit(f"{log}: expected {n} records after {n_warm} warm-up requests, got {len(idx)}")
    return idx


def main(workload: str, node: str, records: str, log: str, depths: str) -> None:
    plan = single_card(load_node(Path(node)))
    spec = load_workload(Path(workload))
    vocab = plan.contract.model.vocab_size
    reqs = generate(spec, vocab, int(records))
    orders = [("forge's order", [reqs[i] for i in forge_order(log, WARMUP, len(reqs))])]
    for bits, name in ((0, "power-of-two classes"), (1, "half classes"), (2, "quarter classes")):
        orders.append((name, sorted(reqs, key=lambda r, b=bits: -output_class(r.max_new_tokens, b))))
    orders.append(("exact length", sorted(reqs, key=lambda r: -r.max_new_tokens)))
    eng = DirectEngine(plan)
    warm = warmup_requests(spec, vocab, WARMUP)
    for name, seq in orders:
        for d in depths.split(","):
            m = eng.manager()
            m.start()
            try:
                _feed(m, list(warm), None, eng, "warm")
                s0 = m.current_batch
                _feed(m, seq, None if d == "all" else int(d), eng, "r")
                print(f"{name:22} depth {d:>4}: {m.current_batch - s0} steps")
            finally:
                m.stop(block=True, timeout=30, hard_stop=True)
                m.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:6])
