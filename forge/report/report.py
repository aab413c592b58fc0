"""The run report: `<output>.report.json` (the data, format in docs/metrics.md) and `.report.md`.

`forge run` / `forge deploy` call `write_report` once the work is done (after a final
`sampler.sample()`); `forge report` turns the JSON into plots (forge/report/plots.py)."""
from __future__ import annotations

import glob
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forge.errors import display_path
from forge.records.writer import valid_text
from forge.report.files import REPORT_FORMAT, REPORT_VERSION, report_paths, write_json_and_markdown
from forge.report.markdown import render_markdown
from forge.report.rates import rate_series
from forge.report.sampler import Sampler


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _cards(sampler: Sampler, series: dict[str, Any], wall_s: float | None) -> list[dict[str, Any]]:
    cards = []
    total = sum(s.input_tokens + s.output_tokens for s in sampler.last_engines.values())
    for entry in series["cards"]:
        s = sampler.last_engines[f"{entry['node']}/{entry['card']}"]
        col = entry["series"]
        delivered = [
            None if a is None or b is None else a + b
            for a, b in zip(col["input_tokens"], col["output_tokens"])
        ]
        rates = [r for r in rate_series(series["t_s"], delivered) if r is not None]
        tokens = s.input_tokens + s.output_tokens
        per_step = _ratio(s.input_tokens - s.prefix_hit_tokens + s.output_tokens, s.engine_steps)
        cards.append(
            {
                "node": s.node,
                "card": s.card,
                "tier": s.tier,
                "token_budget": s.token_budget,
                "slots": s.slots,
                "kv_blocks_total": s.kv_blocks_total,
                "healthy": s.healthy,
                "input_tokens": s.input_tokens,
                "output_tokens": s.output_tokens,
                "token_share": _ratio(tokens, total),
                "mean_output_tokens_per_s": _ratio(s.output_tokens, wall_s or 0.0),  # generated
                "mean_tokens_per_s": _ratio(tokens, wall_s or 0.0),  # prompt + generated: its work
                "peak_tokens_per_s": max(rates) if rates else None,
                "engine_steps": s.engine_steps,
                "mean_tokens_per_step": per_step,
                "mean_budget_use": per_step / s.token_budget
                if per_step is not None and s.token_budget
                else None,
                "prefix_hit_ratio": _ratio(s.prefix_hit_tokens, s.input_tokens),
                "prefix_hit_tokens": s.prefix_hit_tokens,
                "requests": {
                    "ok": s.requests_ok,
                    "failed": s.requests_failed,
                    "cancelled": s.requests_cancelled,
                    "requeued": s.requests_requeued,
                },
                "admission_refusals": s.admission_refusals,
                "retries": s.retries,
                "stalls": s.stalls,
                "progress_only_steps": s.progress_only_steps,
                "preemptions": s.preemptions,
            }
        )
    return cards


def build_report(summary: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    """The report as a JSON-ready dict (see docs/metrics.md, "Run report")."""
    run = sampler.last_run
    started_at = (
        run.started_at if run is not None else (sampler.times[0] if sampler.times else None)
    )
    series = sampler.series(started_at)
    wall_s = summary.get("wall_s")
    if wall_s is None and sampler.times and started_at is not None:
        wall_s = sampler.times[-1] - started_at
    if run is not None:
        tokens_in, tokens_out = run.input_tokens, run.output_tokens
    else:
        tokens_in = sum(s.input_tokens for s in sampler.last_engines.values())
        tokens_out = sum(s.output_tokens for s in sampler.last_engines.values())
    b, led = sampler.last_broker, sampler.last_ledger
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "started_at_unix_s": started_at,
        "summary": summary,
        "totals": {
            "records_total": run.total if run else None,
            "done": run.done if run else None,
            "failed": run.failed if run else None,
            "skipped": run.skipped if run else None,
            "retried": run.retried if run else None,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "wall_s": wall_s,
            "tokens_per_s": _ratio(tokens_in + tokens_out, wall_s or 0.0),
            "output_tokens_per_s": _ratio(tokens_out, wall_s or 0.0),
            "prompt_tokens_per_s": _ratio(tokens_in, wall_s or 0.0),
            "stalls": sum(s.stalls for s in sampler.last_engines.values()),
            "progress_only_steps": sum(
                s.progress_only_steps for s in sampler.last_engines.values()
            ),
        },
        "cards": _cards(sampler, series, wall_s),
        "broker": None
        if b is None
        else {
            "padding_ratio": b.padding_ratio,
            "prefix_reuse_ratio": b.prefix_reuse_ratio,
            "dispatched": b.dispatched,
            "affinity_hits": b.affinity_hits,
            "affinity_spills": b.affinity_spills,
            "no_fit": b.no_fit,
            "prompt_tokens": b.prompt_tokens,
            "shared_prefix_tokens": b.shared_prefix_tokens,
            "padded_tokens": b.padded_tokens,
            "batch_tokens": b.batch_tokens,
        },
        "ledger": None
        if led is None
        else {
            "commits": led.commits,
            "rows_committed": led.rows_committed,
            "mean_commit_s": _ratio(led.total_commit_s, led.commits),
            "last_commit_s": led.last_commit_s,
        },
        "sampler": {"errors": sampler.errors, "last_error": sampler.last_error},
        "series": series,
    }


def _previous(json_path: Path, run_id: str | None) -> dict[str, Any] | None:
    """The report this run continues: the same run (ledger identity), written by an earlier
    start."""
    if run_id is None:
        return None
    try:
        prev = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(prev, dict)
        and prev.get("format") == REPORT_FORMAT
        and prev.get("version") == REPORT_VERSION
    )
    return prev if ok and prev.get("run_id") == run_id else None


def write_report(target: str | os.PathLike, summary: dict[str, Any], sampler: Sampler, *,
                 final_sample: bool = True, run_id: str | None = None, resumed: bool = False,
                 starts: int | None = None) -> tuple[Path, Path]:
    """Write the JSON and Markdown reports beside `target` (an output file or a run directory). By
    default it first takes the sampler's final point, so the series end where the run did. `run_id`
    names the run (its ledger's identity); a `resumed` run's report continues the one its earlier
    starts wrote (forge/report/merge.py), and `starts` (the ledger's count) puts back the starts
    that wrote none. Plots already rendered beside the report are rendered again."""
    if final_sample:
        sampler.sample(force=True)
    report = build_report(summary, sampler)
    json_path, md_path = report_paths(target)
    if run_id is not None:
        report["run_id"] = run_id
    prev = _previous(json_path, run_id) if resumed else None
    if prev is not None:
        from forge.report.merge import merge_reports

        report = merge_reports(prev, report)
    # the ledger's count of starts: one killed outright wrote no report
    if resumed and starts is not None:
        from forge.report.merge import add_unreported_starts

        report = add_unreported_starts(report, starts)
    # the Markdown names the JSON file: a name that is not UTF-8 is quoted with its bytes escaped,
    # as in the JSON
    write_json_and_markdown(
        json_path,
        report,
        md_path,
        render_markdown(report, valid_text(display_path(json_path))),
        indent=1,
    )
    _refresh_plots(json_path)
    return json_path, md_path


def _refresh_plots(json_path: Path) -> None:
    """PNGs of an earlier report beside this one would show a run that is not this report's: draw
    them again (or, if that fails, remove them; `forge report` draws them)."""
    stale = sorted(
        json_path.parent.glob(f"{glob.escape(json_path.name.removesuffix('.json'))}.*.png")
    )
    if not stale:
        return
    try:
        from forge.report.plots import render_plots

        fresh = set(render_plots(json_path))
    except Exception:  # noqa: BLE001 - plotting is a convenience here; the report itself is written
        fresh = set()
    for png in stale:
        if png not in fresh:
            png.unlink(missing_ok=True)
