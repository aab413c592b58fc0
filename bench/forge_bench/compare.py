"""`forge bench compare`: tiers side by side on the same work, interleaved in one process.

Each tier is a one-card node description. For every repeat, every tier runs every mode in turn (tier
A forge, tier A direct, tier B forge, ...), each on a freshly loaded engine: the slow drift of a
machine (clocks, other tenants) falls on all tiers alike, and a ratio is read between runs minutes
apart, not calls apart. `direct` is transformers' own API with the tier's own switches (forge's pure
mapping, bench/forge_bench/direct.py), so forge ÷ direct holds the switches equal. The sweep's
confirm step is this command on the shipped tier and the sweep's best."""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from forge.config.load import LoadedDescription
from forge.errors import UsageError
from forge_bench.bounds import bounds_line, tier_bounds
from forge_bench.forge_mode import run_forge, write_records
from forge_bench.direct import direct_engine
from forge_bench.modes import check_fits, repeat_order, single_card, warmup_requests
from forge_bench.report import _fmt, gpu_util_line, header, mode_rows, write_report
from forge_bench.workload import WorkloadSpec, generate

MODES = ("forge", "direct")


def run_compare(
    tiers: Sequence[tuple[str, LoadedDescription]],
    spec: WorkloadSpec,
    workdir: Path,
    *,
    modes: Sequence[str] = ("forge",),
    records: Optional[int] = None,
    warmup: int = 8,
    repeat: int = 2,
    progress: Callable[[str], None] = lambda line: None,
    on_result: Callable[[list, list[dict]], None] = lambda reqs, res: None,
) -> tuple[list, list[dict]]:
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise UsageError(f"--modes: expected some of {', '.join(MODES)}, got "
                         f"{', '.join(modes) or 'none'}")
    plans = [single_card(loaded) for _, loaded in tiers]
    vocabs = {p.contract.model.vocab_size for p in plans}
    if len(vocabs) != 1:
        raise UsageError(f"the tiers' models have different vocabularies ({sorted(vocabs)}): not "
                         "the same work")
    for p in plans:
        check_fits(spec, p)
    vocab = vocabs.pop()
    requests = generate(spec, vocab, records)
    warm = warmup_requests(spec, vocab, warmup)
    records_path = write_records(requests, workdir / "records.jsonl")
    results: list[dict] = []
    runs = [
        (label, loaded, plan, mode) for (label, loaded), plan in zip(tiers, plans) for mode in modes
    ]
    for rep in range(repeat):
        # every other repeat reversed (modes.py)
        for label, loaded, plan, mode in repeat_order(runs, rep):
            started = time.perf_counter()
            if mode == "direct" and plan.replicas > 1:
                progress(f"{label}: direct skipped (the direct engine is one manager; the card "
                         "runs "
                         f"{plan.replicas} replicas)")
                continue
            if mode == "direct":
                eng = direct_engine(plan)
                # vLLM's own offline API takes the whole batch (LLM.generate) and schedules it
                # itself; transformers' manager was measured fastest fed at the depth of its slots
                # (direct.py)
                variant = "all" if plan.contract.backend == "vllm" else f"depth:{plan.slots}"
                try:
                    r = eng.run(requests, variant, warmup=warm)
                finally:
                    eng.close()
            else:
                r = run_forge(
                    loaded,
                    records_path,
                    len(requests),
                    workdir / label,
                    grouping=True,
                    warmup=warm,
                    label="forge",
                )
            r.notes.append(f"repeat {rep + 1}")
            row = dict(
                r.to_dict(),
                tier=label,
                repeat=rep + 1,
                wall_s=round(time.perf_counter() - started, 2),
            )
            results.append(row)
            progress(f"{label} {mode}: {r.tokens_per_s:,.0f} tok/s ({r.completed}/{r.requests} in "
                     f"{r.window_s:.2f} s; repeat {rep + 1})")
            on_result(requests, results)
    return requests, results


def _complete(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["completed"] == r["requests"] and r["requests"]]


def summarize(labels: Sequence[str], results: list[dict]) -> dict:
    """Per tier and mode: every run's tok/s, their mean and best; each tier over the first (by mean
    and by best), and forge ÷ direct per tier (means)."""
    out: dict = {"tiers": {}}
    for label in labels:
        per: dict = {}
        for mode in MODES:
            runs = _complete([r for r in results if r["tier"] == label and r["mode"] == mode])
            if runs:
                tps = [r["tokens_per_s"] for r in runs]
                per[mode] = {
                    "runs": tps,
                    "mean": round(statistics.fmean(tps), 2),
                    "best": max(tps),
                    "mean_window_s": round(statistics.fmean(r["window_s"] for r in runs), 4),
                }
        if "forge" in per and "direct" in per:
            per["forge_over_direct"] = round(per["forge"]["mean"] / per["direct"]["mean"], 4)
        out["tiers"][label] = per
    first = out["tiers"].get(labels[0], {}) if labels else {}
    for label in labels[1:]:
        per = out["tiers"][label]
        for mode in MODES:
            if mode in per and mode in first:
                per[f"{mode}_over_{labels[0]}"] = {
                    "mean": round(per[mode]["mean"] / first[mode]["mean"], 4),
                    "best": round(per[mode]["best"] / first[mode]["best"], 4),
                }
    return out


def add_bounds(
    summary: dict, tiers: Sequence[tuple[str, LoadedDescription]], requests, peaks: Optional[dict]
) -> dict:
    for label, loaded in tiers:
        summary["tiers"].setdefault(label, {})["bounds"] = tier_bounds(
            single_card(loaded), requests, peaks
        )
    return summary


def compare_markdown(data: dict) -> str:
    s, labels = data["summary"], data["labels"]
    lines = header(f"forge bench compare: {data['workload']['spec']['workload']} on "
                   f"{', '.join(labels)}", data["env"])
    lines += [
        f"Workload: {data['workload']['summary']['requests']} requests, "
        f"{data['workload']['summary']['prompt_tokens']:,} prompt tokens. Interleaved in one "
        "process, "
        f"{data['repeat']} repeat(s); every run on a freshly loaded engine.",
        "",
        "| tier | contract | mode | runs (tok/s) | mean | best | mean ÷ "
        + labels[0]
        + " | forge ÷ direct |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for label in labels:
        per = s["tiers"].get(label, {})
        for mode in MODES:
            if mode not in per:
                continue
            ratio = per.get(f"{mode}_over_{labels[0]}", {}).get("mean")
            lines.append(
                f"| {label} | {data['contracts'][label]} | {mode} | "
                f"{', '.join(_fmt(v) for v in per[mode]['runs'])} | "
                f"{_fmt(per[mode]['mean'])} | "
                f"{_fmt(per[mode]['best'])} | {_fmt(ratio, '.3f') if ratio else '—'} | "
                f"{_fmt(per.get('forge_over_direct'), '.3f') if mode == 'forge' else ''} |"
            )
    lines += [""]
    for label in labels:
        per = s["tiers"].get(label, {})
        if "bounds" in per:
            window = (per.get("forge") or per.get("direct") or {}).get("mean_window_s")
            lines += [f"**{label}.** " + bounds_line(per["bounds"], window), ""]
    lines += ["## Every run", ""] + mode_rows(
        [dict(r, mode=f"{r['tier']} {r['mode']}") for r in data["results"]]
    )
    return "\n".join(lines + ["", gpu_util_line(data["results"]), ""])


def write_compare(out: Path, data: dict) -> list[Path]:
    return write_report(out, "compare", data, compare_markdown(data))

