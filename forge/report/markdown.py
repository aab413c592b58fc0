"""The Markdown face of a run report: what a person reads first, beside the output."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

SUMMARY_FIRST = (
    "command",
    "function",
    "node",
    "input",
    "output",
    "contract",
    "wall_s",
    "exit",
    "output_tokens_per_s",
    "prompt_tokens_per_s",
)


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v).replace("|", "\\|")


def _utc(unix_s: float | None) -> str:
    if unix_s is None:
        return "–"
    return datetime.fromtimestamp(unix_s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _field(key: str, v: Any) -> str:
    """A summary value as a person reads it: a time (`finished_at`, unix seconds) as a UTC date, not
    a number."""
    if key.endswith("_at") and isinstance(v, (int, float)) and not isinstance(v, bool):
        return _utc(v) + " UTC"
    return _fmt(v)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def render_markdown(report: dict[str, Any], json_name: str) -> str:
    summary, totals = report["summary"], report["totals"]
    out = ["# forge run report", "", f"Written {report['created_at']}; the data is in "
                                     f"`{json_name}`.", ""]
    # Nested values (per-card lists, ...) are the command's own copy of what the sections below
    # show.
    scalars = {k: v for k, v in summary.items() if not isinstance(v, (dict, list, tuple))}
    keys = [k for k in SUMMARY_FIRST if k in scalars] + sorted(
        k for k in scalars if k not in SUMMARY_FIRST
    )
    out += _table(["field", "value"], [[k, _field(k, summary[k])] for k in keys]) if keys else []

    out += ["## Totals", ""]
    # Generated tokens/s first: what engines and their benchmarks call tok/s.
    out += _table(
        [
            "records",
            "done",
            "failed",
            "retried",
            "skipped",
            "generated tokens",
            "prompt tokens",
            "wall (s)",
            "generated tok/s",
            "prompt tok/s",
            "stalls",
            "progress-only steps",
        ],
        [
            [
                _fmt(totals.get(k))
                for k in (
                    "records_total",
                    "done",
                    "failed",
                    "retried",
                    "skipped",
                    "output_tokens",
                    "input_tokens",
                    "wall_s",
                    "output_tokens_per_s",
                    "prompt_tokens_per_s",
                    "stalls",
                    "progress_only_steps",
                )
            ]
        ],
    )

    if report.get("runs"):
        out += ["## Runs", "", "This output was written by several starts of the same run "
                               "(resumed); the figures "
                "above add them up, and the plots put their running times back to back.", ""]
        out += _table(
            [
                "start",
                "started (UTC)",
                "wall (s)",
                "done",
                "failed",
                "generated tokens",
                "prompt tokens",
                "stopped by",
            ],
            [
                [
                    str(i),
                    _utc(r.get("started_at_unix_s")),
                    _fmt(r.get("wall_s")),
                    _fmt(r.get("done")),
                    _fmt(r.get("failed")),
                    _fmt(r.get("output_tokens")),
                    _fmt(r.get("input_tokens")),
                    r.get("interrupted") or "–",
                ]
                for i, r in enumerate(report["runs"], 1)
            ],
        )

    if report["cards"]:
        out += ["## Cards", "",
                "Share is the card's part of all tokens delivered (prompt + generated); work tok/s "
                "counts prompt and "
                "generated tokens together, the work the card did; budget use is the mean tokens "
                "per engine step over "
                "the contract's `max_num_tokens`.", ""]
        rows = []
        for c in report["cards"]:
            req = c["requests"]
            rows.append(
                [
                    f"{c['node']}/{c['card']}",
                    c["tier"],
                    _fmt(c["token_budget"]),
                    _fmt(c["slots"]),
                    _fmt(c["output_tokens"]),
                    _fmt(c["input_tokens"]),
                    _pct(c["token_share"]),
                    _fmt(c.get("mean_output_tokens_per_s")),
                    _fmt(c["mean_tokens_per_s"]),
                    _fmt(c["peak_tokens_per_s"]),
                    _pct(c["mean_budget_use"]),
                    f"{req['ok']:,} / {req['failed']:,} / {req['requeued']:,}",
                    _fmt(c["admission_refusals"]),
                    _fmt(c["stalls"]),
                    _fmt(c["progress_only_steps"]),
                    _fmt(c["healthy"]),
                ]
            )
        out += _table(
            [
                "card",
                "tier",
                "budget",
                "slots",
                "generated tokens",
                "prompt tokens",
                "share",
                "mean generated tok/s",
                "mean work tok/s",
                "peak work tok/s",
                "budget use",
                "requests ok / failed / requeued",
                "refusals",
                "stalls",
                "progress-only",
                "healthy",
            ],
            rows,
        )

    if report["broker"]:
        b = report["broker"]
        out += ["## Broker", ""]
        out += _table(
            ["padding", "prefix reuse", "dispatched", "affinity hits", "affinity spills", "no fit"],
            [
                [
                    _pct(b["padding_ratio"]),
                    _pct(b["prefix_reuse_ratio"]),
                    _fmt(b["dispatched"]),
                    _fmt(b["affinity_hits"]),
                    _fmt(b["affinity_spills"]),
                    _fmt(b["no_fit"]),
                ]
            ],
        )
    if report["ledger"]:
        led = report["ledger"]
        mean_ms = None if led["mean_commit_s"] is None else 1000 * led["mean_commit_s"]
        out += ["## Ledger", ""]
        out += _table(["commits", "rows", "mean commit (ms)", "last commit (ms)"],
                      [[_fmt(led["commits"]), _fmt(led["rows_committed"]), _fmt(mean_ms),
                        _fmt(1000 * led["last_commit_s"])]])
    if report["sampler"]["errors"]:
        out += [f"Stats sampling failed {report['sampler']['errors']} time(s); last: "
                f"`{report['sampler']['last_error']}`.", ""]
    out += ["## Plots", "", f"`forge report {json_name}` renders tokens/s per card, in-flight and "
                            "queue depth, "
            "and budget and KV use over time as PNG files beside this report.", ""]
    return "\n".join(out)
