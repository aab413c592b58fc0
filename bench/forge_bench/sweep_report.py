"""The sweep's report: sweep.json (everything), sweep.md (what a reader quotes), sweep.png.
Rewritten after every candidate, so a sweep that is cut off still leaves what it measured and what
it did not get to."""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from forge.atomic import save_figure
from forge.report.files import DPI
from forge_bench.bounds import bounds_line
from forge_bench.candidates import fmt
from forge_bench.report import _fmt, header, write_report

STAGES = {"base": "shipped", "one": "one change", "try": "--try", "combine": "combined"}


def _row(i: int, c: dict, base_tps) -> str:
    r = c.get("result") or {}
    tps = c.get("tokens_per_s")
    ratio = f"{tps / base_tps:.3f}" if tps and base_tps else "—"
    change = "the shipped tier" if c["stage"] == "base" else c["key"]
    window = f"{r['window_s']:.2f}" if r.get("window_s") else "—"
    wall = f"{c['wall_s']:.1f}" if c.get("wall_s") else "—"
    return (f"| {i} | {STAGES[c['stage']]} | {change} | {c['status']} | {_fmt(tps)} | {ratio} | "
            f"{window} | {wall} | "
            f"{c.get('reason') or ''} |")


def sweep_markdown(data: dict) -> str:
    cands, conf, win = data["candidates"], data["confirm"], data["winner"]
    base_tps = cands[0].get("tokens_per_s") if cands else None
    lines = header(
        f"forge bench sweep: {data['contract']} ({data['workload']['spec']['workload']})",
        data["env"],
    )
    o = data["options"]
    deadline = "none" if o["deadline_s"] is None else f"{o['deadline_s']:g} s"
    lines += ["Measured through "
              f"{'the forge path (broker grouping on)' if data['mode'] == 'forge' else 'the direct engine'}; "
              "each candidate in its own process (load, warm-up, window), "
              f"{data['workload']['summary']['requests']} "
              f"requests, limit {o['candidate_limit_s']:g} s; total deadline {deadline}; elapsed "
              f"{data['elapsed_s']:.0f} s.", ""]
    counts = {
        s: sum(1 for c in cands if c["status"] == s)
        for s in ("ran", "skipped", "cut", "failed", "pending")
    }
    lines += [
        f"Candidates: {len(cands)} — {counts['ran']} ran, {counts['skipped']} skipped, "
        f"{counts['cut']} cut, "
        f"{counts['failed']} failed"
        + (f", {counts['pending']} not reached" if counts["pending"] else "")
        + ".",
        "",
    ]
    if win.get("key"):
        lines += [f"**Winner: {win['key']}** — {win['why']}."]
    else:
        lines += [f"**No winner** — {win.get('why', '')}."]
    if conf.get("status") == "ran":
        lines += [f"Confirm (shipped vs best, {conf['repeat']} interleaved repeat(s) in one "
                  "process, "
                  f"{conf.get('records') or 'all'} records): best ÷ shipped "
                  f"{conf['ratio_mean']:.3f} (means), "
                  f"{conf['ratio_best']:.3f} (best runs). {conf.get('note') or ''}"]
    else:
        lines += [f"Confirm: {conf.get('status')} — {conf.get('reason', '')}."]
    for path in data.get("written") or []:
        lines += [f"Written: `{path}`."]
    lines += [
        "",
        "## Candidates",
        "",
        "| # | stage | change | status | total tok/s | ÷ shipped | window s | wall s | note |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [_row(i, c, base_tps) for i, c in enumerate(cands)]
    lines += [
        "",
        "Total tok/s: prompt + generated over the window (first request in, last result "
        "out). Wall: the "
        "candidate's process from start to exit. ÷ shipped: one sweep run each, so within "
        "the run-to-run spread "
        "(about ±10 % on this engine) only the confirm step's interleaved repeats decide.",
        "",
    ]
    if data.get("combine_note"):
        lines += [f"Combination: {data['combine_note']}.", ""]
    for label, b in (data.get("bounds") or {}).items():
        lines += [f"**{label}.** " + bounds_line(b["bounds"], b.get("window_s")), ""]
    lines += ["## Dimensions", ""]
    for d in data["dimensions"]:
        vals = ", ".join(
            fmt(c["value"]) + (f" (not here: {c['unavailable']})" if c["unavailable"] else "")
            for c in d["choices"]
        )
        lines += [f"- `{d['field']}`: {vals}" + (f" — {d['note']}" if d.get("note") else "")]
    lines += ["", "## Strategy", "", data["strategy"], ""]
    return "\n".join(lines)


def sweep_plot(data: dict, path: Path) -> Path:
    ran = [c for c in data["candidates"] if c.get("tokens_per_s")]
    fig = Figure(figsize=(8, 0.9 + 0.32 * max(len(ran), 1)), dpi=DPI)
    ax = fig.subplots()
    labels = ["shipped" if c["stage"] == "base" else c["key"] for c in ran]
    colors = ["#7f7f7f" if c["stage"] == "base" else "#1f77b4" for c in ran]
    ax.barh(range(len(ran)), [c["tokens_per_s"] for c in ran], color=colors)
    ax.set_yticks(
        range(len(ran)), [lb if len(lb) < 60 else lb[:57] + "..." for lb in labels], fontsize=7
    )
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s (prompt + generated)")
    ax.set_title(f"sweep: {data['contract']} (one run each; the confirm step decides)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    return path


def write_sweep(out: Path, data: dict) -> list[Path]:
    return write_report(out, "sweep", data, sweep_markdown(data)) + [
        sweep_plot(data, out / "sweep.png")
    ]
