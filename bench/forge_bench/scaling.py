"""`forge bench scaling`: how throughput scales with cards when engines compete for the CPU, in one
run.

N cards of the CPU-bound instant engine (`instant: {step_cpu_ms: X}`, no model;
bench/forge_bench/cpu_nodes.py), N = 1, 2, 4, 8, each card alone and then all together
(bench/forge_bench/cards.py, grouped mode), once with the engines in the node's own process (card
transport "thread": before) and once in one worker process per card ("process": after); then two
cards at speeds 3:1 the same way; then `forge bench control-plane` per transport. Runs interleave:
every repeat goes through every N and transport in turn.

    together ÷ (N × alone)   the together run's tokens/s over the sum of the N cards' alone runs
    shares at 3:1           each card's part of the together run's tokens, against 75/25 and its speed share

Each together run takes records × Σ speeds ÷ fastest speed (N × records for equal cards), so its
window is about one card alone's. Every node file, every per-N report and the summary go under
--out."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from forge.config.load import LoadedDescription, load_node
from forge.errors import UsageError
from forge_bench.cards import CardsPlan, cards_data, run_cards
from forge_bench.cpu_nodes import STEP_CPU_MS, step_ms_for, write_cpu_node
from forge_bench.report import write_cards_bench
from forge_bench.workload import WorkloadSpec, generate, summary

DEFAULT_CARDS = (1, 2, 4, 8)
TRANSPORTS = ("thread", "process")
MAX_CARDS = 64
TARGETS = {
    "together_over_n_alone": {2: 0.95, 8: 0.90},
    "share_points": 5.0,
    "tasks_per_cpu_s": 20_000,
}


@dataclass
class ScalingPlan:
    out: Path
    spec: WorkloadSpec
    workload_file: Path
    cards: Sequence[int] = DEFAULT_CARDS
    transports: Sequence[str] = TRANSPORTS
    speeds: Sequence[float] = (3.0, 1.0)
    step_cpu_ms: float = STEP_CPU_MS
    records: int = 600
    repeat: int = 2
    warmup: int = 8
    control_plane_records: int = 50_000
    progress: Callable[[str], None] = field(default=lambda line: None)
    on_update: Callable[[dict], None] = field(default=lambda data: None)
    env: Callable[[], dict] = field(default=dict)


def card_counts(text: str) -> list[int]:
    """"1,2,4,8" -> [1, 2, 4, 8] (sorted, distinct, 1..MAX_CARDS)."""
    try:
        out = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        out = []
    if not out or out[0] < 1 or out[-1] > MAX_CARDS:
        raise UsageError(f"--cards: expected card counts from 1 to {MAX_CARDS}, comma-separated; "
                         f"got {text!r}")
    return out


def check_transports(loaded: LoadedDescription, transports: Sequence[str]) -> None:
    """Refuse a transport this build lacks before anything runs (the node refuses it at
    construction)."""
    from forge.node.local import LocalNode

    for t in transports:
        LocalNode(loaded, card_transport=t)


def _cell(
    kind: str,
    key,
    transport: str,
    loaded: LoadedDescription,
    node_path: Path,
    sp: ScalingPlan,
    together_records: int,
) -> dict:
    return {
        "kind": kind,
        "key": key,
        "transport": transport,
        "node": str(node_path),
        "loaded": loaded,
        "together_records": together_records,
        "results": [],
        "dir": sp.out / f"{loaded.node.node}-{transport}",
    }


def run_scaling(sp: ScalingPlan) -> dict:
    nodes = sp.out / "nodes"
    cells: list[dict] = []
    for n in sp.cards:
        path = write_cpu_node(nodes, f"cpu-{n}", [sp.step_cpu_ms] * n)
        loaded = load_node(path)
        cells += [_cell("equal", n, t, loaded, path, sp, n * sp.records) for t in sp.transports]
    steps = step_ms_for(sp.speeds, sp.step_cpu_ms)
    path = write_cpu_node(nodes, "cpu-" + "to".join(f"{s:g}" for s in sp.speeds), steps)
    loaded = load_node(path)
    unequal_records = round(sp.records * sum(sp.speeds) / max(sp.speeds))
    cells += [
        _cell("unequal", list(sp.speeds), t, loaded, path, sp, unequal_records)
        for t in sp.transports
    ]
    check_transports(cells[0]["loaded"], sp.transports)
    vocab = cells[0]["loaded"].plans[0].contract.model.vocab_size
    work = {"file": str(sp.workload_file), "spec": sp.spec.model_dump(),
            "summary": summary(generate(sp.spec, vocab, sp.records))}
    started = time.perf_counter()
    data: dict = {
        "kind": "forge-bench-scaling",
        "env": sp.env(),
        "settings": _settings(sp, steps),
        "cells": [],
        "control_plane": [],
    }

    def publish() -> None:
        data["cells"] = [_cell_summary(c, sp, work) for c in cells]
        data["elapsed_s"] = round(time.perf_counter() - started, 1)
        sp.on_update(data)

    for rep in range(sp.repeat):
        for c in cells:
            sp.progress(f"repeat {rep + 1}/{sp.repeat}: {c['loaded'].node.node} ({c['transport']})")
            got = run_cards(
                CardsPlan(
                    loaded=c["loaded"],
                    spec=sp.spec,
                    workdir=c["dir"] / "work",
                    modes=("forge",),
                    records=sp.records,
                    together_records=c["together_records"],
                    warmup=sp.warmup,
                    repeat=1,
                    card_transport=c["transport"],
                    progress=sp.progress,
                )
            )
            for r in got:
                r.repeat = rep + 1
            c["results"] += got
            # no PNG per cell: device minutes go to runs
            write_cards_bench(c["dir"], _cards_report(c, sp, work), plot=False)
            publish()
    from forge_bench.control_plane import run_control_plane

    for t in sp.transports:
        sp.progress(f"control plane ({t}): {sp.control_plane_records:,} records")
        cp = run_control_plane(
            sp.out / f"control-plane-{t}",
            records=sp.control_plane_records,
            core=None,
            repeat=sp.repeat,
            card_transport=t,
        )
        data["control_plane"].append(cp)
        publish()
    publish()
    return data


def _settings(sp: ScalingPlan, steps: Sequence[float]) -> dict:
    return {
        "cards": list(sp.cards),
        "transports": list(sp.transports),
        "speeds": list(sp.speeds),
        "step_cpu_ms": sp.step_cpu_ms,
        "unequal_step_cpu_ms": list(steps),
        "records": sp.records,
        "repeat": sp.repeat,
        "warmup": sp.warmup,
        "control_plane_records": sp.control_plane_records,
        "workload": str(sp.workload_file),
        "targets": {
            "together_over_n_alone": TARGETS["together_over_n_alone"],
            "share_points": TARGETS["share_points"],
            "tasks_per_cpu_s": TARGETS["tasks_per_cpu_s"],
        },
    }


def _cards_report(c: dict, sp: ScalingPlan, work: dict) -> dict:
    return cards_data(
        env=sp.env(),
        loaded=c["loaded"],
        workload=work,
        card_transport=c["transport"],
        together_records=c["together_records"],
        results=c["results"],
    )


def _cell_summary(c: dict, sp: ScalingPlan, work: dict) -> dict:
    rep = _cards_report(c, sp, work)
    m = rep["summary"].get(
        "forge", {"repeats": [], "together_over_sum": None, "worst_share_points_off": None}
    )
    out = {"kind": c["kind"], "key": c["key"], "transport": c["transport"], "node": c["node"],
           "report": str(c["dir"] / "bench.md"), "together_records": c["together_records"],
           "repeats": m["repeats"], "together_over_sum": m["together_over_sum"]}
    if c["kind"] == "unequal":
        nominal = [s / sum(sp.speeds) for s in sp.speeds]
        ids = [p.card_id for p in c["loaded"].plans]
        out["nominal_shares"] = dict(zip(ids, nominal))
        out["points_off_nominal"] = [
            max(abs(100 * (r["shares"][i]["share"] - w)) for i, w in zip(ids, nominal))
            for r in m["repeats"]
            if r["complete"]
        ]
        out["points_off_speed"] = [max(abs(s["points_off"]) for s in r["shares"].values())
                                   for r in m["repeats"] if r["complete"]]
    return out

