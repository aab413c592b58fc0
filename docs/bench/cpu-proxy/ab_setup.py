"""What the A/B scripts beside this file share: the direct engine of a one-card node, a workload's requests and the
bench's warm-up requests, and the alternating order of the two arms (forge/bench/modes.py repeat_order)."""
from __future__ import annotations

from pathlib import Path

from forge.bench.direct import DirectEngine
from forge.bench.modes import repeat_order, single_card, warmup_requests
from forge.bench.workload import generate, load_workload
from forge.config.load import load_node

WARMUP = 8          # forge bench's warm-up requests (its default)


def direct_setup(workload: str, node: str, records: str):
    """(DirectEngine, requests, warm-up requests) for NODE's one card and the first RECORDS of WORKLOAD."""
    plan = single_card(load_node(Path(node)))
    spec = load_workload(Path(workload))
    vocab = plan.contract.model.vocab_size
    return DirectEngine(plan), generate(spec, vocab, int(records)), warmup_requests(spec, vocab, WARMUP)


def arms(repeat: int) -> list[bool]:
    """Without, then with, the change under test; reversed in every other repeat."""
    return repeat_order([False, True], repeat)
