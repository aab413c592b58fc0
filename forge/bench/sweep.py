"""`forge bench sweep CONTRACT`: the engine-tier sweep. The contract's token budget (max_num_tokens) and
slots (max_batch_size) are varied around their values, one tier per pair, everything else unchanged; each
tier is measured on the same work through the forge path (or the direct engine), and the best is reported.

The seeds found the per-step token budget to be the largest engine-side lever; on transformers' engine it
is one too (shared/reference/transformers-engine.md). A tier that breaks a contract rule (a budget below
max_input_len) is listed as skipped, with the rule, not run."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from matplotlib.figure import Figure

from forge.bench.direct import DirectEngine
from forge.bench.forge_mode import run_forge, write_records
from forge.bench.modes import check_fits, warmup_requests
from forge.bench.report import DPI, _fmt, header, mode_rows, write_json
from forge.bench.results import ModeResult, best
from forge.bench.workload import WorkloadSpec, generate
from forge.config.load import LoadedNode, load_paths
from forge.config.plan import plan_card
from forge.errors import ConfigError, UsageError

DEFAULT_FACTORS = (0.5, 1.0, 2.0)


def parse_ints(text: Optional[str], flag: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None
    if not values or values[0] <= 0:
        raise UsageError(f"{flag}: expected positive whole numbers, got {text!r}")
    return values


def around(value: int, factors: Sequence[float] = DEFAULT_FACTORS) -> list[int]:
    return sorted({max(1, int(round(value * f))) for f in factors})


def contract_name(arg: str) -> str:
    """CONTRACT is a contract name, or a contract file (its `contract:` name is used)."""
    p = Path(arg)
    if not p.is_file():
        return arg
    got = load_paths([p])
    if got.errors:
        raise ConfigError(got.errors)
    if len(got.contracts) != 1:
        raise UsageError(f"{arg}: expected one engine contract, found {len(got.contracts)}")
    return next(iter(got.contracts))


def plan_of(loaded: LoadedNode, name: str):
    plan = next((p for p in loaded.plans if p.contract.contract == name), None)
    if plan is None:
        runs = ", ".join(sorted({p.contract.contract for p in loaded.plans}))
        raise UsageError(f"node {loaded.node.node} has no card running contract {name!r} (its cards run: {runs})")
    return plan


def tier_node(loaded: LoadedNode, name: str, tokens: int, slots: int) -> tuple[Optional[LoadedNode], Optional[str]]:
    """The node with its card's contract re-tiered; (None, why) when the tier breaks a contract rule."""
    plan = plan_of(loaded, name)
    c = plan.contract
    if tokens < c.limits.max_input_len:
        return None, f"max_num_tokens {tokens} < max_input_len {c.limits.max_input_len}"
    tier = c.model_copy(update={"limits": c.limits.model_copy(update={"max_num_tokens": tokens,
                                                                          "max_batch_size": slots})})
    tplan = plan_card(plan.card, tier)
    if not tplan.fits_memory:
        return None, "weights + KV pool exceed the card's memory"
    return LoadedNode(node=loaded.node, contracts={**loaded.contracts, name: tier}, plans=[tplan],
                      warnings=[]), None


def run_sweep(loaded: LoadedNode, name: str, spec: WorkloadSpec, workdir: Path, *, tokens: Optional[list[int]],
              slots: Optional[list[int]], mode: str = "forge", direct_variant: str = "depth",
              records: Optional[int] = None, warmup: int = 8,
              progress: Callable[[str], None] = lambda line: None,
              on_tier: Callable[[dict, list[dict]], None] = lambda summary, tiers: None) -> tuple[dict, list[dict]]:
    plan = plan_of(loaded, name)
    lim = plan.contract.limits
    tokens = tokens or around(lim.max_num_tokens)
    slots = slots or around(lim.max_batch_size)
    check_fits(spec, plan)
    vocab = plan.contract.model.vocab_size
    requests = generate(spec, vocab, records)
    warm = warmup_requests(spec, vocab, warmup)
    records_path = write_records(requests, workdir / "records.jsonl")
    tiers: list[dict] = []
    for t in tokens:
        for s in slots:
            node, why = tier_node(loaded, name, t, s)
            row = {"max_num_tokens": t, "max_batch_size": s, "base": t == lim.max_num_tokens and s == lim.max_batch_size}
            tiers.append(row)
            if node is None:
                row["skipped"] = why
                progress(f"tier {t}/{s}: skipped ({why})")
                continue
            started = time.perf_counter()
            if mode == "direct":
                eng = DirectEngine(node.plans[0])
                try:
                    r = eng.run(requests, f"depth:{s}" if direct_variant == "depth" else direct_variant, warmup=warm)
                finally:
                    eng.close()
            else:
                r = run_forge(node, records_path, len(requests), workdir, grouping=True, warmup=warm, label="forge")
            r.mode, r.variant = f"tier {t}/{s}", mode if mode != "direct" else r.variant
            row["result"] = r.to_dict()
            row["wall_s"] = round(time.perf_counter() - started, 2)
            progress(f"tier {t}/{s}: {r.tokens_per_s:,.0f} tok/s ({r.completed}/{r.requests} in {r.window_s:.2f} s)")
            on_tier(summarize(name, mode, tokens, slots, tiers), tiers)
    return summarize(name, mode, tokens, slots, tiers), tiers


def summarize(name: str, mode: str, tokens: list[int], slots: list[int], tiers: list[dict]) -> dict:
    ran = [(row, ModeResult(**{k: v for k, v in row["result"].items() if k in ModeResult.__dataclass_fields__}))
           for row in tiers if "result" in row]
    top = best([r for _, r in ran])
    best_row = next((row for row, r in ran if r is top), None)
    base_row = next((row for row, _ in ran if row["base"]), None)
    summary = {"contract": name, "mode": mode, "tokens": tokens, "slots": slots,
               "best": None if best_row is None else {k: best_row[k] for k in ("max_num_tokens", "max_batch_size")},
               "best_tokens_per_s": top.tokens_per_s if top else None,
               "base_tokens_per_s": base_row["result"]["tokens_per_s"] if base_row else None}
    if top and base_row:
        summary["best_over_base"] = round(top.tokens_per_s / base_row["result"]["tokens_per_s"], 4)
    return summary


def sweep_markdown(data: dict) -> str:
    s = data["summary"]
    lines = header(f"forge bench sweep: {s['contract']} ({data['workload']['spec']['workload']})", data["env"])
    b = s["best"]
    lines += [f"Measured through: {'the forge path (broker grouping on)' if s['mode'] == 'forge' else 'the direct engine'}. "
              f"Workload: {data['workload']['summary']['requests']} requests.", ""]
    if b:
        ratio = f" (best ÷ contract {s['best_over_base']:.3f})" if s.get("best_over_base") else ""
        lines += [f"**Best tier: max_num_tokens {b['max_num_tokens']:,}, max_batch_size {b['max_batch_size']}** — "
                  f"{_fmt(s['best_tokens_per_s'])} tok/s; the contract's own tier: {_fmt(s['base_tokens_per_s'])} "
                  f"tok/s{ratio}.", ""]
    else:
        lines += ["No tier completed the workload.", ""]
    lines += ["| max_num_tokens \\ max_batch_size | " + " | ".join(str(x) for x in s["slots"]) + " |",
              "| ---: | " + " | ".join("---:" for _ in s["slots"]) + " |"]
    cell = {(r["max_num_tokens"], r["max_batch_size"]): r for r in data["tiers"]}
    for t in s["tokens"]:
        vals = []
        for sl in s["slots"]:
            r = cell.get((t, sl))
            text = "skipped" if r is None or "skipped" in r else _fmt(r["result"]["tokens_per_s"])
            vals.append(f"**{text}**" if r and r.get("base") else text)
        lines.append(f"| {t:,} | " + " | ".join(vals) + " |")
    lines += ["", "Bold: the contract's own tier. Cells: total tokens/s (prompt + generated).", ""]
    skipped = [r for r in data["tiers"] if "skipped" in r]
    if skipped:
        lines += ["Skipped tiers: " + "; ".join(f"{r['max_num_tokens']}/{r['max_batch_size']}: {r['skipped']}"
                                              for r in skipped), ""]
    lines += ["## Every tier", ""] + mode_rows([r["result"] for r in data["tiers"] if "result" in r]) + [""]
    return "\n".join(lines)


def sweep_plot(data: dict, path: Path) -> Path:
    s = data["summary"]
    cell = {(r["max_num_tokens"], r["max_batch_size"]): r for r in data["tiers"]}
    fig = Figure(figsize=(7, 4.2), dpi=DPI)
    ax = fig.subplots()
    for sl in s["slots"]:
        xs, ys = [], []
        for t in s["tokens"]:
            r = cell.get((t, sl))
            if r and "result" in r:
                xs.append(t)
                ys.append(r["result"]["tokens_per_s"])
        if xs:
            ax.plot(xs, ys, marker="o", label=f"{sl} slots")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("max_num_tokens (token budget per step)")
    ax.set_ylabel("tokens/s (prompt + generated)")
    ax.set_title(f"engine-tier sweep: {s['contract']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_sweep(out: Path, data: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "sweep.md"
    md.write_text(sweep_markdown(data), encoding="utf-8")
    return [write_json(out / "sweep.json", data), md, sweep_plot(data, out / "sweep.png")]
