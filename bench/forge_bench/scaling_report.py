"""The report of `forge bench scaling` (bench/forge_bench/scaling.py): JSON with everything, one
Markdown page."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from forge_bench.report import _fmt, header, write_report


def _range(s: Optional[dict]) -> str:
    if not s:
        return "—"
    return f"{s['min']:.3f}" if s["min"] == s["max"] else f"{s['min']:.3f} – {s['max']:.3f}"


def _verdict(ok: Optional[bool]) -> str:
    return "not measured" if ok is None else ("met" if ok else "**NOT met**")


def targets(data: dict) -> list[tuple[str, Optional[bool], str]]:
    """(target, met?, what was measured); None where its cells did not run."""
    t = data["settings"]["targets"]
    out = []
    for n, want in t["together_over_n_alone"].items():
        cell = next((c for c in data["cells"] if c["kind"] == "equal" and str(c["key"]) == str(n)
                     and c["transport"] == "process"), None)
        got = cell and cell["together_over_sum"]
        out.append((f"N = {n}, worker processes: together ÷ (N × alone) ≥ {want}",
                    None if not got else got["min"] >= want, _range(got)))
    cell = next(
        (c for c in data["cells"] if c["kind"] == "unequal" and c["transport"] == "process"), None
    )
    offs = cell and cell.get("points_off_nominal")
    speeds = ":".join(f"{s:g}" for s in data["settings"]["speeds"])
    out.append((f"cards at {speeds}, worker processes: shares within {t['share_points']:g} points "
                "of nominal",
                None if not offs else max(offs) <= t["share_points"],
                f"{max(offs):.1f} points at most" if offs else "—"))
    cp = next((c for c in data["control_plane"] if c.get("card_transport") == "process"), None)
    out.append(
        (
            f"control plane, engine in a worker process: ≥ {t['tasks_per_cpu_s']:,} tasks per "
            "CPU-second of the "
            "node process",
            None if cp is None else cp["best_tasks_per_cpu_s"] >= t["tasks_per_cpu_s"],
            f"{cp['best_tasks_per_cpu_s']:,.0f}" if cp else "—",
        )
    )
    return out


def scaling_markdown(data: dict) -> str:
    s = data["settings"]
    lines = header("forge bench scaling: CPU-bound cards, engines in the node process vs in worker "
                   "processes",
                   data["env"], label="instant (no model) engines that spend Python CPU per step: "
                                      "this measures "
                                      "contention, not an engine")
    lines += [f"Cards: `instant: {{step_cpu_ms: {s['step_cpu_ms']:g}}}`, 32 slots, 256 tokens per "
              "step; workload "
              f"`{s['workload']}`, {s['records']} records per card alone, together runs scaled to "
              "the same window; "
              f"{s['repeat']} interleaved repeat(s); grouped (forge) mode. Transports: thread = "
              "engines in the node's "
              f"process (before), process = one worker process per card (after). "
              f"Took {data.get('elapsed_s', 0):.0f} s.",
              "", "## Equal cards: together ÷ (N × alone)", "",
              "| N | " + " | ".join(s["transports"]) + " |",
              "| ---: | " + " | ".join("---:" for _ in s["transports"]) + " |"]
    for n in s["cards"]:
        row = []
        for t in s["transports"]:
            c = next(
                (
                    c
                    for c in data["cells"]
                    if c["kind"] == "equal" and c["key"] == n and c["transport"] == t
                ),
                None,
            )
            row.append(_range(c and c["together_over_sum"]))
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    lines += ["", "| N | transport | repeat | Σ alone tok/s | together tok/s | together ÷ (N × "
                  "alone) | report |",
              "| ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for c in (c for c in data["cells"] if c["kind"] == "equal"):
        for r in c["repeats"]:
            if r["complete"]:
                lines.append(f"| {c['key']} | {c['transport']} | {r['repeat']} | "
                             f"{_fmt(r['sum_alone_tokens_per_s'])} | "
                             f"{_fmt(r['together_tokens_per_s'])} | {r['together_over_sum']:.3f} | "
                             f"{c['report']} |")
            else:
                lines.append(f"| {c['key']} | {c['transport']} | {r['repeat']} | incomplete | | | "
                             f"{c['report']} |")
    speeds = ":".join(f"{x:g}" for x in s["speeds"])
    lines += ["", f"## Unequal cards at {speeds} (step_cpu_ms "
                  f"{', '.join(f'{x:g}' for x in s['unequal_step_cpu_ms'])})",
              "", "| transport | repeat | share, per card | speed share (alone) | points off "
                  "nominal | "
              "points off speed | together ÷ Σ alone |", "| --- | ---: | --- | --- | ---: | ---: | "
                                                         "---: |"]
    for c in (c for c in data["cells"] if c["kind"] == "unequal"):
        done = [r for r in c["repeats"] if r["complete"]]
        for r, off_n, off_s in zip(
            done, c.get("points_off_nominal", []), c.get("points_off_speed", [])
        ):
            got = ", ".join(f"{k} {100 * v['share']:.1f} %" for k, v in r["shares"].items())
            speed = ", ".join(f"{k} {100 * v['speed_share']:.1f} %" for k, v in r["shares"].items())
            lines.append(f"| {c['transport']} | {r['repeat']} | {got} | {speed} | {off_n:.1f} | "
                         f"{off_s:.1f} | "
                         f"{r['together_over_sum']:.3f} |")
    lines += ["", "## Control plane (instant engine, answers at once)", "",
              "| transport | records | best tasks/s (wall) | best tasks per CPU-s of the node "
              "process |",
              "| --- | ---: | ---: | ---: |"]
    for cp in data["control_plane"]:
        lines.append(f"| {cp.get('card_transport', 'thread')} | {cp['records']:,} | "
                     f"{cp['best_tasks_per_s']:,.0f} | "
                     f"{cp['best_tasks_per_cpu_s']:,.0f} |")
    lines += ["", "## Targets", ""]
    lines += [f"- {name}: {_verdict(ok)} ({got})" for name, ok, got in targets(data)]
    lines.append("")
    return "\n".join(lines)


def write_scaling(out: Path, data: dict) -> list[Path]:
    return write_report(out, "scaling", data, scaling_markdown(data))
