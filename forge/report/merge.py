"""One report for one output, however many times its run was started: a resumed run's report is the
report of the runs before it followed by this one's, never this run's alone (which, on a resume,
holds only its part).

Counts and tokens add up; `records_resumed`/`skipped` stay what was settled before the report's
first run; wall time is the runs' running time added (not the pauses between them); rates are
recomputed from the sums. The series are laid back to back on that running-time axis, each resume's
time listed in `series.resumes_t_s`, and thinned to the sampler's bound. `runs` lists each start's
own figures."""
from __future__ import annotations

from typing import Any, Optional

from forge.report.sampler import BROKER_FIELDS, CARD_FIELDS, DEFAULT_MAX_POINTS, RUN_FIELDS, _halve

SUMMED = (
    "records_done",
    "records_failed",
    "retried",
    "requeued",
    "input_tokens",
    "output_tokens",
    "wall_s",
)
TOTALS_SUMMED = ("done", "failed", "retried", "input_tokens", "output_tokens", "wall_s", "stalls",
                 "progress_only_steps")
CARD_SUMMED = (
    "input_tokens",
    "output_tokens",
    "engine_steps",
    "prefix_hit_tokens",
    "admission_refusals",
    "retries",
    "stalls",
    "progress_only_steps",
    "preemptions",
)
BROKER_SUMMED = ("dispatched", "affinity_hits", "affinity_spills", "no_fit", "prompt_tokens",
                 "shared_prefix_tokens", "padded_tokens", "batch_tokens")


def _add(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    return a + b


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if num is not None and den else None


def _segment(report: dict) -> dict:
    t, s = report["totals"], report["summary"]
    return {
        "started_at_unix_s": report.get("started_at_unix_s"),
        "created_at": report.get("created_at"),
        "wall_s": t.get("wall_s"),
        "done": t.get("done"),
        "failed": t.get("failed"),
        "input_tokens": t.get("input_tokens"),
        "output_tokens": t.get("output_tokens"),
        "interrupted": s.get("interrupted"),
    }


UNREPORTED = "no report: the start ended without writing one (killed, or stopped before it ran)"


def add_unreported_starts(report: dict, starts: int) -> dict:
    """The ledger counts every start of a run; a start killed outright (SIGKILL, power) wrote no
    report, so the reports merged so far miss it. Put one row back for each missing start, just
    before this one, with the rows those starts left in the output (known from the ledger: what this
    start found settled, less what the reported starts settled)."""
    runs = report.get("runs") or [_segment(report)]
    missing = starts - len(runs)
    if missing <= 0:
        return report
    earlier, this = runs[:-1], runs[-1]
    found = report["totals"].get("skipped") or 0        # rows settled when this start began
    reported = sum((r.get("done") or 0) + (r.get("failed") or 0) for r in earlier)
    left = max(found - reported, 0)
    rows = [
        {
            "started_at_unix_s": None,
            "created_at": None,
            "wall_s": None,
            "done": left if missing == 1 else None,
            "failed": None,
            "input_tokens": None,
            "output_tokens": None,
            "interrupted": UNREPORTED,
        }
    ] + [
        {
            "started_at_unix_s": None,
            "created_at": None,
            "wall_s": None,
            "done": None,
            "failed": None,
            "input_tokens": None,
            "output_tokens": None,
            "interrupted": UNREPORTED,
        }
    ] * (missing - 1)
    return {**report, "runs": earlier + rows + [this]}


def _prefix_hits(card: dict) -> Optional[float]:
    if card.get("prefix_hit_tokens") is not None:
        return card["prefix_hit_tokens"]
    return (
        None
        if card.get("prefix_hit_ratio") is None
        else card["prefix_hit_ratio"] * (card["input_tokens"] or 0)
    )


def _merge_cards(prev: list[dict], cur: list[dict], wall_s: Optional[float]) -> list[dict]:
    merged: dict[tuple, dict] = {}
    for card in prev + cur:
        key = (card["node"], card["card"])
        card = {**card, "prefix_hit_tokens": _prefix_hits(card), "requests": dict(card["requests"])}
        if key not in merged:
            merged[key] = card
            continue
        m = merged[key]
        for k in CARD_SUMMED:
            m[k] = _add(m.get(k), card.get(k))
        m["requests"] = {k: _add(m["requests"].get(k), v) for k, v in card["requests"].items()}
        peaks = [
            p for p in (m.get("peak_tokens_per_s"), card.get("peak_tokens_per_s")) if p is not None
        ]
        m["peak_tokens_per_s"] = max(peaks) if peaks else None
        # the latest run's
        for k in ("tier", "token_budget", "slots", "kv_blocks_total", "healthy"):
            m[k] = card[k]
    total = sum((c["input_tokens"] or 0) + (c["output_tokens"] or 0) for c in merged.values())
    for c in merged.values():
        tokens = (c["input_tokens"] or 0) + (c["output_tokens"] or 0)
        c["token_share"] = _ratio(tokens, total)
        c["mean_tokens_per_s"] = _ratio(tokens, wall_s)
        c["mean_output_tokens_per_s"] = _ratio(c["output_tokens"] or 0, wall_s)
        hits = c["prefix_hit_tokens"] or 0
        c["mean_tokens_per_step"] = _ratio(
            (c["input_tokens"] or 0) - hits + (c["output_tokens"] or 0), c.get("engine_steps")
        )
        c["mean_budget_use"] = _ratio(c["mean_tokens_per_step"], c["token_budget"])
        c["prefix_hit_ratio"] = _ratio(c["prefix_hit_tokens"], c["input_tokens"])
    return list(merged.values())


def _merge_broker(prev: Optional[dict], cur: Optional[dict]) -> Optional[dict]:
    if prev is None or cur is None:
        return cur or prev
    out = {k: _add(prev.get(k), cur.get(k)) for k in BROKER_SUMMED}
    if out["prompt_tokens"] is not None and out["batch_tokens"] is not None:
        out["padding_ratio"] = _ratio(out["padded_tokens"], out["batch_tokens"]) or 0.0
        out["prefix_reuse_ratio"] = _ratio(out["shared_prefix_tokens"], out["prompt_tokens"]) or 0.0
    else:  # a report of an older forge has no raw counts: weight the ratios by dispatches
        n = (prev.get("dispatched") or 0) + (cur.get("dispatched") or 0)
        for k in ("padding_ratio", "prefix_reuse_ratio"):
            weighted = sum((r[k] or 0) * (r.get("dispatched") or 0) for r in (prev, cur))
            out[k] = _ratio(weighted, n)
    return out


def _merge_ledger(prev: Optional[dict], cur: Optional[dict]) -> Optional[dict]:
    if prev is None or cur is None:
        return cur or prev
    commits = (prev["commits"] or 0) + (cur["commits"] or 0)
    seconds = sum((r["mean_commit_s"] or 0) * (r["commits"] or 0) for r in (prev, cur))
    return {
        "commits": commits,
        "rows_committed": _add(prev["rows_committed"], cur["rows_committed"]),
        "mean_commit_s": _ratio(seconds, commits),
        "last_commit_s": cur["last_commit_s"],
    }


def _columns(
    groups: list[Optional[dict]], lengths: list[int], kinds: dict[str, str]
) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in kinds}
    for group, n in zip(groups, lengths):
        for name in kinds:
            col = (group or {}).get(name) or []
            out[name] += list(col[:n]) + [None] * (n - len(col))
    return out


def merge_series(prev: dict, cur: dict, max_points: int = DEFAULT_MAX_POINTS) -> dict:
    offset = prev["t_s"][-1] if prev["t_s"] else 0.0
    t = list(prev["t_s"]) + [round(offset + x, 3) for x in cur["t_s"]]
    lengths = [len(prev["t_s"]), len(cur["t_s"])]
    cards: dict[tuple, dict] = {}
    for i, series in enumerate((prev, cur)):
        for card in series["cards"]:
            entry = cards.setdefault((card["node"], card["card"]), {**card, "parts": [None, None]})
            entry.update({k: v for k, v in card.items() if k not in ("series", "parts")})
            entry["parts"][i] = card["series"]
    merged = {
        "stride_s": max(prev.get("stride_s", 0), cur.get("stride_s", 0)),
        "t_s": t,
        "resumes_t_s": list(prev.get("resumes_t_s", [])) + [offset],
        "run": _columns([prev["run"], cur["run"]], lengths, RUN_FIELDS),
        "broker": _columns([prev["broker"], cur["broker"]], lengths, BROKER_FIELDS),
        "cards": [
            {
                **{k: v for k, v in c.items() if k != "parts"},
                "series": _columns(c["parts"], lengths, CARD_FIELDS),
            }
            for c in cards.values()
        ],
    }
    # the same bound, and the same thinning, as the sampler's
    while len(merged["t_s"]) > max_points:
        merged["t_s"] = _halve(merged["t_s"], "counter")
        for group, kinds in ((merged["run"], RUN_FIELDS), (merged["broker"], BROKER_FIELDS)):
            for name in kinds:
                group[name] = _halve(group[name], kinds[name])
        for card in merged["cards"]:
            for name in CARD_FIELDS:
                card["series"][name] = _halve(card["series"][name], CARD_FIELDS[name])
        merged["stride_s"] *= 2
    return merged


def merge_reports(prev: dict, cur: dict) -> dict:
    """`cur` (this run's report) continued from `prev` (the report of the runs before it, same
    output and run)."""
    summary = dict(cur["summary"])
    for k in SUMMED:
        summary[k] = _add(prev["summary"].get(k), cur["summary"].get(k))
    summary["records_resumed"] = prev["summary"].get(
        "records_resumed", summary.get("records_resumed")
    )
    wall = summary.get("wall_s")
    tin, tout = summary.get("input_tokens") or 0, summary.get("output_tokens") or 0
    summary["tokens_per_s"], summary["output_tokens_per_s"] = (
        _ratio(tin + tout, wall),
        _ratio(tout, wall),
    )
    summary["prompt_tokens_per_s"] = _ratio(tin, wall)
    summary["cards"] = _merge_cards_summary(
        prev["summary"].get("cards") or [], cur["summary"].get("cards") or []
    )
    totals = dict(cur["totals"])
    for k in TOTALS_SUMMED:
        totals[k] = _add(prev["totals"].get(k), cur["totals"].get(k))
    totals["skipped"] = prev["totals"].get("skipped")
    tin, tout = totals.get("input_tokens") or 0, totals.get("output_tokens") or 0
    totals["tokens_per_s"] = _ratio(tin + tout, totals["wall_s"])
    totals["output_tokens_per_s"] = _ratio(tout, totals["wall_s"])
    totals["prompt_tokens_per_s"] = _ratio(tin, totals["wall_s"])
    broker = _merge_broker(prev.get("broker"), cur.get("broker"))
    if broker is not None:
        summary["padding_ratio"], summary["prefix_reuse_ratio"] = (
            broker["padding_ratio"],
            broker["prefix_reuse_ratio"],
        )
    return {
        **cur,
        "started_at_unix_s": prev.get("started_at_unix_s", cur.get("started_at_unix_s")),
        "runs": (prev.get("runs") or [_segment(prev)]) + [_segment(cur)],
        "summary": summary, "totals": totals,
        "cards": _merge_cards(prev.get("cards") or [], cur.get("cards") or [], totals["wall_s"]),
        "broker": broker,
        "ledger": _merge_ledger(prev.get("ledger"), cur.get("ledger")),
        "sampler": {"errors": (prev["sampler"]["errors"] or 0) + (cur["sampler"]["errors"] or 0),
                    "last_error": cur["sampler"]["last_error"] or prev["sampler"]["last_error"]},
        "series": merge_series(prev["series"], cur["series"]),
    }


def _merge_cards_summary(prev: list[dict], cur: list[dict]) -> list[dict]:
    """The summary's own short per-card list: tokens, requests, stalls summed per node/card."""
    merged: dict[tuple, dict] = {}
    for card in prev + cur:
        key = (card.get("node"), card["card"])
        if key not in merged:
            merged[key] = dict(card)
            continue
        for k in ("input_tokens", "output_tokens", "requests", "stalls", "progress_only_steps"):
            merged[key][k] = _add(merged[key].get(k), card.get(k))
        merged[key]["tier"] = card["tier"]
    return list(merged.values())
