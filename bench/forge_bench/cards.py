"""`forge bench run --node` with several cards: each card alone, then all cards on one queue, per
mode.

For every repeat and every mode (forge = grouped, fifo) the node's cards run the workload one at a
time (each alone: a node of that one card) and then all together (the whole node, one broker),
interleaved:

    repeat 1: forge [card0, card1, ..., together]  fifo [card0, card1, ..., together]
    repeat 2: ...

The figures the report quotes come from runs of the same repeat and mode, side by side:
    together ÷ Σ alone      total tokens/s of the together run over the sum of the cards' alone runs
    share vs speed share    each card's part of the together run's tokens, against its alone throughput's
                            part of Σ alone (speed = what the card delivers alone)
    affinity                broker hits and spills, broker-estimated prefix reuse, engine-counted prefix hits
    GPU util                each card's NVML utilisation, mean and max over the window (bench/forge_bench/gpu_sampler.py)"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from forge.config.load import LoadedDescription
from forge.errors import ForgeError, UsageError
from forge_bench.forge_mode import run_forge, write_records
from forge_bench.modes import check_fits, repeat_order, warmup_requests
from forge_bench.results import ModeResult
from forge_bench.workload import BenchRequest, WorkloadSpec, generate

CARD_MODES = ("forge", "fifo")
TOGETHER = "together"


@dataclass
class CardsPlan:
    loaded: LoadedDescription
    spec: WorkloadSpec
    workdir: Path
    modes: Sequence[str] = CARD_MODES
    records: Optional[int] = None
    together_records: Optional[int] = None      # default: the same records as each card alone
    warmup: int = 8
    repeat: int = 1
    concurrency: Optional[int] = None
    card_transport: str = "process"
    progress: Callable[[str], None] = field(default=lambda line: None)
    on_result: Callable[[list[ModeResult]], None] = field(default=lambda res: None)


def one_card(loaded: LoadedDescription, index: int) -> LoadedDescription:
    """The node reduced to one of its cards (same name, same contracts, that card's plan)."""
    plan = loaded.plans[index]
    card = next(c for c in loaded.node.cards if c.index == plan.card.index)
    return LoadedDescription(
        node=loaded.node.model_copy(update={"cards": [card]}),
        contracts=loaded.contracts,
        plans=[plan],
        warnings=[],
    )


def check_modes(modes: Sequence[str], cards: int) -> None:
    unknown = [m for m in modes if m not in CARD_MODES]
    if "direct" in unknown:
        raise UsageError("--modes direct: the direct mode drives one engine; this node has "
                         f"{cards} cards "
                         "(measure direct with a one-card node, or choose from "
                         f"{', '.join(CARD_MODES)})")
    if unknown:
        raise UsageError(f"--modes: unknown mode(s) {', '.join(unknown)} (choose from "
                         f"{', '.join(CARD_MODES)})")
    if not modes:
        raise UsageError("--modes: name at least one mode")


def run_cards(cp: CardsPlan) -> list[ModeResult]:
    plans = cp.loaded.plans
    check_modes(cp.modes, len(plans))
    vocabs = {p.contract.model.vocab_size for p in plans}
    for p in plans:
        check_fits(cp.spec, p)
    vocab = min(vocabs)                    # token ids every card's model can take
    alone_reqs = generate(cp.spec, vocab, cp.records)
    together_reqs = (
        alone_reqs if cp.together_records is None else generate(cp.spec, vocab, cp.together_records)
    )
    warm = warmup_requests(cp.spec, vocab, cp.warmup)
    alone_path = write_records(alone_reqs, cp.workdir / "records.jsonl")
    together_path = (alone_path if together_reqs is alone_reqs
                     else write_records(together_reqs, cp.workdir / "records-together.jsonl"))
    kw = {"concurrency": cp.concurrency} if cp.concurrency else {}
    results: list[ModeResult] = []

    def one(
        loaded: LoadedDescription,
        scope: str,
        path: Path,
        reqs: list[BenchRequest],
        mode: str,
        rep: int,
    ) -> None:
        r = run_forge(
            loaded,
            path,
            len(reqs),
            cp.workdir,
            grouping=(mode == "forge"),
            warmup=warm,
            label=mode,
            card_transport=cp.card_transport,
            **kw,
        )
        r.scope, r.repeat = scope, rep + 1
        results.append(r)
        cp.progress(f"{mode:>5} {scope:<9} rep {rep + 1}: {r.tokens_per_s:10,.0f} tok/s  "
                    f"{r.completed}/{r.requests} in {r.window_s:.2f} s")
        cp.on_result(results)

    # None: all cards together
    runs = [(mode, i) for mode in cp.modes for i in [*range(len(plans)), None]]
    for rep in range(cp.repeat):
        # every other repeat reversed (bench/forge_bench/modes.py)
        for mode, i in repeat_order(runs, rep):
            if i is None:
                one(cp.loaded, TOGETHER, together_path, together_reqs, mode, rep)
            else:
                one(one_card(cp.loaded, i), plans[i].card_id, alone_path, alone_reqs, mode, rep)
    if results and all(r.completed != r.requests for r in results):
        raise ForgeError("no run completed the workload; see the notes in the report")
    return results


def summarize(results: Sequence[dict], cards: Sequence[str]) -> dict:
    """Per mode: one row per repeat (the ratios of that repeat's runs), and the spread over
    repeats."""
    out: dict = {}
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = []
        for rep in sorted({r["repeat"] for r in results if r["mode"] == mode}):
            runs = {r["scope"]: r for r in results if r["mode"] == mode and r["repeat"] == rep}
            alone = {c: runs[c]["tokens_per_s"] for c in cards if c in runs and _complete(runs[c])}
            tog = runs.get(TOGETHER)
            if len(alone) != len(cards) or tog is None or not _complete(tog):
                rows.append({"repeat": rep, "complete": False})
                continue
            sum_alone = sum(alone.values())
            total = sum(c["input_tokens"] + c["output_tokens"] for c in tog["per_card"].values())
            shares = {}
            for c in cards:
                got = tog["per_card"].get(c, {})
                share = (
                    (got.get("input_tokens", 0) + got.get("output_tokens", 0)) / total
                    if total
                    else 0.0
                )
                speed = alone[c] / sum_alone
                shares[c] = {"share": round(share, 4), "speed_share": round(speed, 4),
                             "points_off": round(100 * (share - speed), 2)}
            rows.append(
                {
                    "repeat": rep,
                    "complete": True,
                    "alone_tokens_per_s": alone,
                    "sum_alone_tokens_per_s": round(sum_alone, 2),
                    "together_tokens_per_s": tog["tokens_per_s"],
                    "together_over_sum": round(tog["tokens_per_s"] / sum_alone, 4)
                    if sum_alone
                    else None,
                    "shares": shares,
                    "affinity_hits": tog.get("affinity_hits"),
                    "affinity_spills": tog.get("affinity_spills"),
                    "broker_prefix_reuse_ratio": tog.get("broker_prefix_reuse_ratio"),
                    "engine_prefix_hit_tokens": tog.get("prefix_hit_tokens"),
                    "engine_prefix_reuse_ratio": tog.get("prefix_reuse_ratio"),
                    "alone_engine_prefix_hit_tokens": sum(
                        runs[c].get("prefix_hit_tokens") or 0 for c in cards
                    ),
                    "gpu_util": tog.get("gpu_util"),
                    "alone_gpu_util": {c: (runs[c].get("gpu_util") or {}).get(c) for c in cards},
                }
            )
        done = [r for r in rows if r["complete"]]
        ratios = [r["together_over_sum"] for r in done if r["together_over_sum"] is not None]
        worst = [max(abs(s["points_off"]) for s in r["shares"].values()) for r in done]
        out[mode] = {"repeats": rows,
                     "together_over_sum": _spread(ratios),
                     "worst_share_points_off": _spread(worst)}
    return out


def _complete(r: dict) -> bool:
    return r["completed"] == r["requests"] and r["requests"] > 0


def _spread(xs: list[float]) -> Optional[dict]:
    if not xs:
        return None
    return {
        "min": round(min(xs), 4),
        "median": round(statistics.median(xs), 4),
        "max": round(max(xs), 4),
        "n": len(xs),
    }


def cards_data(*, env: dict, loaded: LoadedDescription, workload: dict, card_transport: str,
               together_records: Optional[int], results: Sequence[ModeResult]) -> dict:
    """The report's data (bench/forge_bench/report.py: write_cards_bench)."""
    from forge_bench.report import card_info

    cards = [card_info(p) for p in loaded.plans]
    rows = [r.to_dict() for r in results]
    return {
        "kind": "forge-bench-cards",
        "env": env,
        "node": loaded.node.node,
        "card_transport": card_transport,
        "together_records": together_records,
        "cards": cards,
        "workload": workload,
        "results": rows,
        "summary": summarize(rows, [c["card"] for c in cards]),
    }
