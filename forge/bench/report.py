"""Bench reports: one JSON (everything), one Markdown page (what a reader quotes), PNG plots.

matplotlib through Figure objects only (no pyplot state), as forge/report/plots.py does."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from matplotlib.figure import Figure

from forge.bench.env import hardware_line, software_line

DPI = 110
COLORS = {"direct": "#7f7f7f", "forge": "#1f3b73", "fifo": "#d62728", "sweep": "#1f77b4", "control-plane": "#2ca02c"}


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    return path


def _fmt(v: Optional[float], spec: str = ",.0f") -> str:
    return "—" if v is None else format(v, spec)


def _pct(v: Optional[float]) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def header(title: str, env: dict, label: Optional[str] = None) -> list[str]:
    lines = [f"# {title}", ""]
    if label:
        lines += [f"**{label}**", ""]
    lines += [f"- date: {env['date']}", f"- hardware: {hardware_line(env)}", f"- software: {software_line(env)}",
              f"- command: `{env['command']}`", ""]
    return lines


def mode_rows(results: list[dict]) -> list[str]:
    rows = ["| mode | variant | done | window s | total tok/s | output tok/s | prefix reuse (engine) | "
            "prefix reuse (broker est.) | padding | notes |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        rows.append(f"| {r['mode']} | {r['variant']} | {r['completed']}/{r['requests']} | {r['window_s']:.2f} | "
                    f"{_fmt(r['tokens_per_s'])} | {_fmt(r['output_tokens_per_s'])} | "
                    f"{_pct(r.get('prefix_reuse_ratio'))} | {_pct(r.get('broker_prefix_reuse_ratio'))} | "
                    f"{_pct(r.get('padding_ratio'))} | {'; '.join(r.get('notes') or [])} |")
    return rows


def bench_markdown(data: dict) -> str:
    env, w, rt = data["env"], data["workload"], data["ratios"]
    card = data["card"]
    lines = header(f"forge bench: {w['spec']['workload']} on {card['contract']}", env)
    lines += [f"Engine: card {card['card']} ({card['model']}), contract `{card['contract']}` "
              f"(backend {card['backend']}; {card['slots']} slots, token budget {card['token_budget']:,}, "
              f"{card['kv_blocks']:,} KV blocks of {card['tokens_per_block']}).", "",
              f"Workload: {w['summary']['requests']} requests, {w['summary']['prompt_tokens']:,} prompt tokens "
              f"(mean {w['summary']['mean_prompt']:.0f}), up to {w['summary']['max_new_tokens']:,} new tokens "
              f"(mean {w['summary']['mean_max_new']:.0f}); {w['summary']['with_shared_prefix']} start with one of "
              f"{w['summary']['distinct_prefixes']} shared prefixes."
              + (f" The workload file's description: “{w['spec']['description']}”." if w['spec'].get('description')
                 else ""), "",
              "## Ratios (best run of each mode, same process, same work)", "",
              "| forge ÷ direct | forge ÷ fifo | fifo ÷ direct | best direct variant |",
              "| ---: | ---: | ---: | --- |",
              f"| {_fmt(rt['forge_over_direct'], '.3f')} | {_fmt(rt['forge_over_fifo'], '.3f')} | "
              f"{_fmt(rt['fifo_over_direct'], '.3f')} | {rt['best']['direct'] or '—'} |", "",
              "## Every run", ""]
    lines += mode_rows(data["results"])
    lines += ["", "Window: from the first request handed in to the last result out (forge and fifo: to the "
              "ledger's last commit); engine load and warm-up excluded. Tokens: prompt + generated (a final EOS "
              "not counted). Prefix reuse (engine): prompt tokens served from reused KV blocks, as the engine "
              "counted them. Padding: the broker's notional batch padding (longest prompt × batch size − real "
              "tokens); transformers packs ragged batches, so it costs nothing there.", ""]
    return "\n".join(lines)


def bench_plot(data: dict, path: Path) -> Path:
    res = data["results"]
    fig = Figure(figsize=(9, 4.2), dpi=DPI)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"{r['mode']}\n{r['variant']}" for r in res]
    xs = range(len(res))
    colors = [COLORS.get(r["mode"], "#999999") for r in res]
    ax1.bar(xs, [r["tokens_per_s"] for r in res], color=colors)
    ax1.bar(xs, [r["output_tokens_per_s"] for r in res], color="white", alpha=0.45, hatch="//",
            label="of which output")
    ax1.set_xticks(list(xs), labels, fontsize=7)
    ax1.set_ylabel("tokens/s (prompt + generated)")
    ax1.set_title("throughput per run", fontsize=10)
    ax1.legend(fontsize=7)
    reuse = [100 * (r.get("prefix_reuse_ratio") or 0.0) for r in res]
    ax2.bar(xs, reuse, color=colors)
    ax2.set_xticks(list(xs), labels, fontsize=7)
    ax2.set_ylabel("prompt tokens from reused KV (%)")
    ax2.set_ylim(0, 100)
    ax2.set_title("prefix reuse in the engine", fontsize=10)
    rt = data["ratios"]
    fig.suptitle(f"{data['workload']['spec']['workload']} on {data['card']['contract']}: forge÷direct "
                 f"{_fmt(rt['forge_over_direct'], '.3f')}, forge÷fifo {_fmt(rt['forge_over_fifo'], '.3f')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_bench(out: Path, data: dict, stem: str = "bench") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_json(out / f"{stem}.json", data)]
    md = out / f"{stem}.md"
    md.write_text(bench_markdown(data), encoding="utf-8")
    paths.append(md)
    paths.append(bench_plot(data, out / f"{stem}.png"))
    return paths


def card_info(plan) -> dict:
    c = plan.contract
    return {"card": plan.card_id, "model": plan.card.model, "contract": c.contract, "backend": c.backend,
            "slots": c.limits.max_batch_size, "token_budget": c.limits.max_num_tokens,
            "max_input_len": c.limits.max_input_len, "max_output_len": c.limits.max_output_len,
            "kv_blocks": plan.num_blocks, "tokens_per_block": c.kv_cache.tokens_per_block,
            "full_length_slots": plan.full_length_slots, "block_reuse": c.kv_cache.block_reuse,
            "precision": c.precision.model_dump()}
