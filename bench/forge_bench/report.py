"""Bench reports: one JSON (everything), one Markdown page (what a reader quotes), PNG plots,
written through forge's report files (forge/report/files.py: the JSON + Markdown pair, the PNGs'
resolution).

matplotlib through Figure objects only (no pyplot state), as forge/report/plots.py does."""
from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Optional

from matplotlib.figure import Figure

from forge.atomic import save_figure
from forge.errors import ForgeError, display_path
from forge.report.files import DPI, write_json_and_markdown
from forge_bench.env import hardware_line, software_line
from forge_bench.gpu_sampler import INTERVAL_S, cell as gpu_cell
COLORS = {
    "direct": "#7f7f7f",
    "forge": "#1f3b73",
    "fifo": "#d62728",
    "sweep": "#1f77b4",
    "control-plane": "#2ca02c",
}


# what forge bench writes into --out, and work/ below it
BENCH_STEMS = ("bench", "sweep", "compare", "control-plane", "scaling")


def _is_bench_json(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return re.match(rb'\{\s*"kind":\s*"forge-bench', f.read(256)) is not None
    except OSError:
        return False


def check_out_folder(out: Path) -> None:
    """forge bench writes fixed names into --out: refuse, before anything runs, a folder where such
    a name is a file forge bench did not write (a JSON without forge's `kind`, or anything there
    without a bench JSON)."""
    if not out.exists():
        return
    jsons = [out / f"{stem}.json" for stem in BENCH_STEMS]
    ours = any(_is_bench_json(p) for p in jsons)
    for p in [
        *jsons,
        *(out / f"{stem}.{ext}" for stem in BENCH_STEMS for ext in ("md", "png")),
        out / "work",
    ]:
        if not (p.exists() or p.is_symlink()):
            continue
        if (p.suffix == ".json" and not _is_bench_json(p)) or (p.suffix != ".json" and not ours):
            raise ForgeError(f"{display_path(p)}: exists and was not written by forge bench; forge "
                             "never writes "
                             "over a file it did not write: choose another --out")


def write_report(out: Path, stem: str, data: dict, markdown: str) -> list[Path]:
    """A report's two files in `out`: STEM.json (the data) and STEM.md (`markdown`, made from it),
    written as forge's run report writes its own."""
    return write_json_and_markdown(
        out / f"{stem}.json", data, out / f"{stem}.md", markdown, indent=2
    )


def _fmt(v: Optional[float], spec: str = ",.0f") -> str:
    return "—" if v is None else format(v, spec)


def _pct(v: Optional[float]) -> str:
    return "—" if v is None else f"{100 * v:.1f} %"


def header(title: str, env: dict, label: Optional[str] = None) -> list[str]:
    lines = [f"# {title}", ""]
    if label:
        lines += [f"**{label}**", ""]
    lines += [
        f"- date: {env['date']}",
        f"- hardware: {hardware_line(env)}",
        f"- software: {software_line(env)}",
        f"- command: `{env['command']}`",
        "",
    ]
    return lines


def mode_rows(results: list[dict]) -> list[str]:
    rows = ["| mode | variant | done | window s | total tok/s | output tok/s | prefix reuse "
            "(engine) | "
            "prefix reuse (broker est.) | padding | engine steps (ms/step) | GPU util mean / max | "
            "notes |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        rows.append(f"| {r['mode']} | {r['variant']} | {r['completed']}/{r['requests']} | "
                    f"{r['window_s']:.2f} | "
                    f"{_fmt(r['tokens_per_s'])} | {_fmt(r['output_tokens_per_s'])} | "
                    f"{_pct(r.get('prefix_reuse_ratio'))} | "
                    f"{_pct(r.get('broker_prefix_reuse_ratio'))} | "
                    f"{_pct(r.get('padding_ratio'))} | {_steps(r)} | {gpu_cell(r.get('gpu_util'))} "
                    "| "
                    f"{'; '.join(r.get('notes') or [])} |")
    return rows


def _steps(r: dict) -> str:
    n = r.get("engine_steps")
    return "—" if not n else f"{n:,} ({r['ms_per_step']:.1f})"


def gpu_util_line(results: list[dict]) -> str:
    """What the GPU util column is, or (once) why it is empty."""
    if any(r.get("gpu_util") for r in results):
        return ("GPU util: NVML's utilisation of each card's GPU (percent of time a kernel ran), "
                "read every "
                f"{INTERVAL_S:g} s over the window; mean / max.")
    why = next((r["gpu_util_missing"] for r in results if r.get("gpu_util_missing")), None)
    return f"GPU util: not sampled ({why or 'no run recorded it'})."


def _per_repeat_lines(rows) -> list[str]:
    """Each repeat's own ratios (its best run of each mode), when the bench ran more than one."""
    if not rows:
        return []
    names = [
        (k, t)
        for k, t in (
            ("forge_over_direct", "forge ÷ direct"),
            ("forge_over_fifo", "forge ÷ fifo"),
            ("fifo_over_direct", "fifo ÷ direct"),
        )
        if any(r.get(k) for r in rows)
    ]
    if not names:
        return []
    return [
        "Per repeat (the modes' order alternates from one repeat to the next): "
        + "; ".join(f"{t} {' / '.join(_fmt(r.get(k), '.3f') for r in rows)}" for k, t in names)
        + ".",
        "",
    ]


def bench_markdown(data: dict) -> str:
    env, w, rt = data["env"], data["workload"], data["ratios"]
    card = data["card"]
    lines = header(f"forge bench: {w['spec']['workload']} on {card['contract']}", env)
    lines += [
        f"Engine: card {card['card']} ({card['model']}), contract `{card['contract']}` "
        f"(backend {card['backend']}; {card['slots']} slots, token budget "
        f"{card['token_budget']:,}, "
        f"{card['kv_blocks']:,} KV blocks of {card['tokens_per_block']}).",
        "",
        f"Workload: {w['summary']['requests']} requests, {w['summary']['prompt_tokens']:,} "
        "prompt tokens "
        f"(mean {w['summary']['mean_prompt']:.0f}), up to {w['summary']['max_new_tokens']:,} "
        "new tokens "
        f"(mean {w['summary']['mean_max_new']:.0f}); {w['summary']['with_shared_prefix']} "
        "start with one of "
        f"{w['summary']['distinct_prefixes']} shared prefixes."
        + (
            f" The workload file's description: “{w['spec']['description']}”."
            if w['spec'].get('description')
            else ""
        ),
        "",
        "## Ratios (best run of each mode, same process, same work)",
        "",
        "| forge ÷ direct | forge ÷ fifo | fifo ÷ direct | best direct variant |",
        "| ---: | ---: | ---: | --- |",
        f"| {_fmt(rt['forge_over_direct'], '.3f')} | {_fmt(rt['forge_over_fifo'], '.3f')} | "
        f"{_fmt(rt['fifo_over_direct'], '.3f')} | {rt['best']['direct'] or '—'} |",
        "",
        *_per_repeat_lines(rt.get("per_repeat")),
        "## Every run",
        "",
    ]
    # the hardware's bounds beside the best run's window (bench/forge_bench/bounds.py)
    if data.get("bounds"):
        from forge_bench.bounds import bounds_line

        done = [r for r in data["results"] if r["completed"] == r["requests"] and r["window_s"]]
        fastest = min(done, key=lambda r: r["window_s"], default=None)
        lines[-2:-2] = [
            bounds_line(data["bounds"], fastest and fastest["window_s"])
            + (f" (measured: {fastest['mode']} {fastest['variant']})" if fastest else ""),
            "",
        ]
    lines += mode_rows(data["results"])
    lines += ["", "Window: from the first request handed in to the last result out (forge and "
                  "fifo: to the "
              "ledger's last commit); engine load and warm-up excluded. Tokens: prompt + generated "
              "(a final EOS "
              "not counted). Prefix reuse (engine): prompt tokens served from reused KV blocks, as "
              "the engine "
              "counted them. Padding: the broker's notional batch padding (longest prompt × batch "
              "size − real "
              "tokens); transformers packs ragged batches, so it costs nothing there. "
              + gpu_util_line(data["results"]), ""]
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
    fig.suptitle(f"{data['workload']['spec']['workload']} on {data['card']['contract']}: "
                 "forge÷direct "
                 f"{_fmt(rt['forge_over_direct'], '.3f')}, forge÷fifo "
                 f"{_fmt(rt['forge_over_fifo'], '.3f')}",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return path


def write_bench(out: Path, data: dict, stem: str = "bench") -> list[Path]:
    return write_report(out, stem, data, bench_markdown(data)) + [
        bench_plot(data, out / f"{stem}.png")
    ]


def card_info(plan) -> dict:
    c = plan.contract
    return {
        "card": plan.card_id,
        "model": plan.card.model,
        "contract": c.contract,
        "backend": c.backend,
        "slots": c.limits.max_batch_size,
        "token_budget": c.limits.max_num_tokens,
        "max_input_len": c.limits.max_input_len,
        "max_output_len": c.limits.max_output_len,
        "kv_blocks": plan.num_blocks,
        "tokens_per_block": c.kv_cache.tokens_per_block,
        "full_length_slots": plan.full_length_slots,
        "block_reuse": c.kv_cache.block_reuse,
        "precision": c.precision.model_dump(),
    }


# ---------------------------------------------------------------- several cards: alone, then
# together
def _workload_line(w: dict) -> str:
    s = w["summary"]
    desc = (w["spec"].get("description") or "").rstrip(".")
    return (f"Workload: {s['requests']} requests, {s['prompt_tokens']:,} prompt tokens (mean "
            f"{s['mean_prompt']:.0f}), "
            f"up to {s['max_new_tokens']:,} new tokens (mean {s['mean_max_new']:.0f}); "
            f"{s['with_shared_prefix']} "
            f"start with one of {s['distinct_prefixes']} shared prefixes. {desc}.")


def cards_markdown(data: dict) -> str:
    env, w = data["env"], data["workload"]
    cards = data["cards"]
    lines = header(f"forge bench: {w['spec']['workload']} on {len(cards)} cards of node "
                   f"{data['node']}", env)
    lines += ["| card | model | contract | backend | slots | token budget | KV blocks |",
              "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {c['card']} | {c['model']} | `{c['contract']}` | {c['backend']} | {c['slots']} | "
              f"{c['token_budget']:,} | {c['kv_blocks']:,} |" for c in cards]
    tr = data.get("together_records")
    lines += [
        "",
        _workload_line(w) + (f" The together run takes {tr} records." if tr else ""),
        "",
        f"Card transport: {data.get('card_transport', 'thread')}. Each card runs the "
        "workload alone (a node "
        "of that card), then all cards take it from one queue; runs interleaved per repeat.",
        "",
    ]
    ids = [c["card"] for c in cards]
    for mode, m in data["summary"].items():
        lines += [f"## {mode} ({'grouped' if mode == 'forge' else 'FIFO'})", "",
                  "| repeat | " + " | ".join(f"{c} alone tok/s" for c in ids) + " | Σ alone | "
                                                                                "together tok/s | "
                  "together ÷ Σ alone | share ÷ speed share, per card | affinity hits / spills | "
                  "prefix reuse "
                  "broker est. / engine | GPU util mean / max, per card (together) |",
                  "| ---: | " + " | ".join("---:" for _ in ids) + " | ---: | ---: | ---: | --- | "
                                                                  "---: | ---: | --- |"]
        for r in m["repeats"]:
            if not r["complete"]:
                lines.append(f"| {r['repeat']} | incomplete: see Every run |")
                continue
            sh = ", ".join(f"{c} {100 * s['share']:.1f} % / {100 * s['speed_share']:.1f} %"
                           for c, s in r["shares"].items())
            lines.append(
                f"| {r['repeat']} | "
                + " | ".join(_fmt(r["alone_tokens_per_s"][c]) for c in ids)
                + f" | {_fmt(r['sum_alone_tokens_per_s'])} | "
                f"{_fmt(r['together_tokens_per_s'])} | "
                f"**{_fmt(r['together_over_sum'], '.3f')}** | {sh} | "
                f"{_fmt(r['affinity_hits'])} / "
                f"{_fmt(r['affinity_spills'])} | {_pct(r['broker_prefix_reuse_ratio'])} / "
                f"{_pct(r['engine_prefix_reuse_ratio'])} | "
                f"{_gpu_per_card(r.get('gpu_util'), ids)} |"
            )
        t, off = m["together_over_sum"], m["worst_share_points_off"]
        if t:
            lines += ["", f"together ÷ Σ alone: min {t['min']:.3f}, median {t['median']:.3f}, max "
                          f"{t['max']:.3f} "
                      f"({t['n']} repeat(s)); worst card's share off its speed share: "
                      f"{off['max']:.1f} points at most.", ""]
        else:
            lines.append("")
    lines += ["## Every run", ""]
    lines += mode_rows([dict(r, variant=f"{r['variant']} · {r['scope']} · rep {r['repeat']}")
                        for r in data["results"]])
    lines += ["", "Speed share: the card's alone tokens/s over Σ alone in the same repeat and "
                  "mode. Share: its part "
              "of the together run's tokens (prompt + generated), as its admission runtime counted "
              "them. Prefix "
              "reuse (engine): prompt tokens the engines served from reused KV blocks, as they "
              "counted them (— "
              "where the engine reports none). " + gpu_util_line(data["results"]), ""]
    return "\n".join(lines)


def _gpu_per_card(util: Optional[dict], ids: list[str]) -> str:
    """Every card named, "—" for one not sampled, so a reader sees which card the figure is."""
    if not util:
        return "—"
    return ", ".join(f"{c} {gpu_cell({c: util[c]}) if c in util else '—'}" for c in ids)


def cards_plot(data: dict, path: Path) -> Path:
    modes = list(data["summary"])
    ids = [c["card"] for c in data["cards"]]
    fig = Figure(figsize=(4 + 2.2 * len(modes), 4.2), dpi=DPI)
    axes = fig.subplots(1, len(modes), squeeze=False)[0]
    for ax, mode in zip(axes, modes):
        rows = [r for r in data["summary"][mode]["repeats"] if r["complete"]]
        if not rows:
            continue
        alone = [statistics.median(r["alone_tokens_per_s"][c] for r in rows) for c in ids]
        tog = statistics.median(r["together_tokens_per_s"] for r in rows)
        bottom = 0.0
        for c, v in zip(ids, alone):
            ax.bar(0, v, bottom=bottom, label=f"{c} alone", alpha=0.8)
            bottom += v
        ax.bar(1, tog, color=COLORS.get(mode, "#999999"), label="together")
        ax.set_xticks([0, 1], ["Σ alone", "together"])
        ax.set_title(
            f"{mode}: together ÷ Σ alone {tog / bottom:.3f}" if bottom else mode, fontsize=9
        )
        ax.set_ylabel("tokens/s (median over repeats)")
        ax.legend(fontsize=6)
    fig.suptitle(f"{data['workload']['spec']['workload']} on {len(ids)} cards "
                 f"({data.get('card_transport', 'thread')})",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    return path


def write_cards_bench(out: Path, data: dict, stem: str = "bench", plot: bool = True) -> list[Path]:
    paths = write_report(out, stem, data, cards_markdown(data))
    return paths + [cards_plot(data, out / f"{stem}.png")] if plot else paths
