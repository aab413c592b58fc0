"""PNG plots of a run report: tokens/s per card, in flight and queue depth, budget and KV use.

matplotlib is used through Figure objects only (no pyplot): no global backend state, no GUI, safe
to call from a CLI command or a test in any process."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

from forge.atomic import save_figure
from forge.errors import ForgeError, UsageError, display_path
from forge.report.files import DPI, REPORT_FORMAT, REPORT_VERSION, is_png
from forge.report.rates import windowed_rate_series

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
STAGE_COLORS = {"producer": "#7f7f7f", "broker": "#1f3b73", "writer": "#bcbd22"}
# the tokens/s plot: mean over this trailing window (bursts of finishing requests)
TOKENS_PER_S_WINDOW_S = 5.0


def load_report(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a report JSON; problems are one UsageError line naming file and field."""
    shown = display_path(path)
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{shown}: cannot read: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise UsageError(f"{shown}::$: not JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise UsageError(
            f"{shown}::$.format: not a forge run report (expected \"{REPORT_FORMAT}\")"
        )
    if report.get("version") != REPORT_VERSION:
        raise UsageError(f"{shown}::$.version: report version {report.get('version')!r} is not "
                         "supported "
                         f"(this forge reads version {REPORT_VERSION})")
    series = report.get("series")
    if not isinstance(series, dict) or not isinstance(series.get("t_s"), list):
        raise UsageError(f"{shown}::$.series.t_s: missing; the report has no time series")
    return report


def _time_axis(t_s: list[float]) -> tuple[list[float], str]:
    span = t_s[-1] - t_s[0] if t_s else 0.0
    if span <= 600:
        return t_s, "time since start (s)"
    if span <= 3 * 3600:
        return [t / 60 for t in t_s], "time since start (min)"
    return [t / 3600 for t in t_s], "time since start (h)"


def _nan(values: list[float | None], scale: float = 1.0) -> list[float]:
    return [math.nan if v is None else v * scale for v in values]


def _present(values: list[float | None]) -> bool:
    return any(v is not None for v in values)


def _legend(ax) -> None:
    """Legend outside the plot area, so it never hides a line."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)


def _thousands(ax) -> None:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _card_label(card: dict[str, Any]) -> str:
    return f"{card['node']}/{card['card']} ({card['tier']})"


def _resumes(report: dict[str, Any], x: list[float]) -> list[float]:
    """Where a resumed run started again, on the plotted axis (its unit may be minutes or hours)."""
    t = report["series"]["t_s"]
    scale = x[-1] / t[-1] if t and t[-1] else 1.0
    return [r * scale for r in report["series"].get("resumes_t_s") or []]


def _figure(rows: int, x: list[float], report: dict[str, Any]) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(12.5, 3.6 * rows + 0.6), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(True, alpha=0.3)
        for i, at in enumerate(_resumes(report, x)):      # a resumed run: its starts, back to back
            ax.axvline(at, color="#555555", ls="--", lw=1.0, label="resumed" if i == 0 else None)
    axes[0].set_xlim(min(0.0, x[0]), x[-1])   # every plot of a report spans the run from its start
    return fig, list(axes)


def _style(n_points: int) -> dict:
    """A short run has few points: mark them, so a line of two points still shows."""
    return {"marker": "o", "ms": 3} if n_points <= 40 else {}


def _title(report: dict[str, Any], what: str) -> str:
    s = report.get("summary", {})
    context = " · ".join(str(s[k]) for k in ("function", "node") if s.get(k))
    return f"{what} — {context}" if context else what


def _mark_events(ax, x, rates, col, color, name: str) -> None:
    """Stalls (x) and progress-only steps (^) where the card's counters went up."""
    for field, marker, what in (
        ("stalls", "x", "stall"),
        ("progress_only_steps", "^", "progress-only step"),
    ):
        values = col.get(field, [])
        hits = [
            i
            for i in range(1, len(values))
            if values[i] is not None and values[i - 1] is not None and values[i] > values[i - 1]
        ]
        if hits:
            ax.plot(
                [x[i] for i in hits],
                [rates[i] or 0.0 for i in hits],
                ls="none",
                marker=marker,
                ms=10,
                mew=2,
                color=color,
                label=f"{name} {what}",
                clip_on=False,
                zorder=5,
            )


def _tokens_per_s(report, x, xlabel, path: Path) -> None:
    t, cards = report["series"]["t_s"], report["series"]["cards"]
    fig, (ax,) = _figure(1, x, report)
    total: list[float] = [0.0] * len(t)
    for i, card in enumerate(cards):
        col = card["series"]
        delivered = [None if a is None or b is None else a + b
                     for a, b in zip(col["input_tokens"], col["output_tokens"])]
        rates = windowed_rate_series(t, delivered, TOKENS_PER_S_WINDOW_S)
        total = [tot + (r or 0.0) for tot, r in zip(total, rates)]
        color = COLORS[i % len(COLORS)]
        # a short run's one or two rates belong to the intervals before their points: drawn as
        # steps, they show
        few = sum(r is not None for r in rates) < 3
        ax.plot(x, _nan(rates), color=color, lw=1.4, label=_card_label(card),
                drawstyle="steps-pre" if few else "default")
        _mark_events(ax, x, rates, col, color, f"{card['node']}/{card['card']}")
    if len(cards) > 1:
        ax.plot(x, [math.nan] + total[1:], color="black", lw=1.2, ls="--", label="all cards")
    ax.set_title(_title(report, "Delivered tokens/s per card (input + output), mean over a "
                                "trailing "
                                f"{TOKENS_PER_S_WINDOW_S:g} s window"))
    ax.set_ylabel("tokens/s")
    ax.set_xlabel(xlabel)
    ax.set_ylim(bottom=0)
    _thousands(ax)
    _legend(ax)
    save_figure(fig, path)


def _in_flight_and_queues(report, x, xlabel, path: Path) -> None:
    series = report["series"]
    fig, (top, bottom) = _figure(2, x, report)
    for i, card in enumerate(series["cards"]):
        color = COLORS[i % len(COLORS)]
        top.plot(
            x,
            _nan(card["series"]["in_flight"]),
            color=color,
            lw=1.4,
            label=f"{_card_label(card)} in flight",
            **_style(len(x)),
        )
        top.axhline(
            card["slots"], color=color, ls=":", lw=1.2, label=f"{card['node']}/{card['card']} slots"
        )
    top.set_title(_title(report, "Requests in flight per card (dotted: the contract's slots)"))
    top.set_ylabel("requests")
    top.set_ylim(0, 1.08 * max([c["slots"] for c in series["cards"]] + [1]))
    _legend(top)

    stages = [
        ("producer", series["run"].get("producer_queue", [])),
        ("broker", series["broker"].get("pending", [])),
        ("writer", series["run"].get("writer_queue", [])),
    ]
    for name, values in stages:
        if _present(values):
            bottom.plot(
                x, _nan(values), color=STAGE_COLORS[name], lw=1.4, label=name, **_style(len(x))
            )
    for i, card in enumerate(series["cards"]):
        values = card["series"]["engine_queued"]
        if _present(values):
            bottom.plot(x, _nan(values), color=COLORS[i % len(COLORS)], lw=1.2, ls="--",
                        label=f"engine {card['node']}/{card['card']}")
    bottom.set_title("Queue depth per stage")
    bottom.set_xlabel(xlabel)
    bottom.set_ylim(bottom=0)
    peaks = [max(v for v in values if v is not None) for _n, values in stages if _present(values)]
    if peaks and max(peaks) > 50 * max(min(peaks), 1):
        # a deep broker queue would flatten the producer and engine queues: log scale past 10
        bottom.set_yscale("symlog", linthresh=10)
        bottom.set_ylabel("items waiting (log scale above 10)")
    else:
        bottom.set_ylabel("items waiting")
    _thousands(bottom)
    _legend(bottom)
    save_figure(fig, path)


def _budget_and_kv(report, x, xlabel, path: Path) -> None:
    fig, (top, bottom) = _figure(2, x, report)
    for i, card in enumerate(report["series"]["cards"]):
        color, col = COLORS[i % len(COLORS)], card["series"]
        budget, blocks = card["token_budget"], card["kv_blocks_total"]
        if budget:
            top.plot(x, _nan(col["tokens_last_step"], 1 / budget), color=color, lw=1.2,
                     label=f"{_card_label(card)}, budget {budget:,} tokens", **_style(len(x)))
        if blocks:
            bottom.plot(
                x,
                _nan(col["kv_blocks_used"], 1 / blocks),
                color=color,
                lw=1.4,
                label=f"{card['node']}/{card['card']} used (of {blocks:,} blocks)",
                **_style(len(x)),
            )
            bottom.plot(
                x,
                _nan(col["kv_blocks_reserved"], 1 / blocks),
                color=color,
                lw=1.0,
                ls="--",
                label=f"{card['node']}/{card['card']} reserved by admission",
            )
    top.set_title(_title(report, "Token budget use per engine step (sampled last step / "
                                 "max_num_tokens)"))
    top.set_ylabel("of the token budget")
    bottom.set_title("KV cache blocks per card")
    bottom.set_ylabel("of the KV pool")
    bottom.set_xlabel(xlabel)
    for ax in (top, bottom):
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        _legend(ax)
    save_figure(fig, path)


PLOTS = (
    ("tokens-per-s", _tokens_per_s),
    ("in-flight-queues", _in_flight_and_queues),
    ("budget-kv", _budget_and_kv),
)


def render_plots(
    report_json: str | os.PathLike, out_dir: str | os.PathLike | None = None
) -> list[Path]:
    """Render the report's PNGs into out_dir (default: beside the report); returns their paths."""
    report_json = Path(report_json)
    report = load_report(report_json)
    t = report["series"]["t_s"]
    if len(t) < 2:
        raise UsageError(f"{display_path(report_json)}::$.series.t_s: {len(t)} sample(s); "
                         "a plot needs at least 2 (the run ended before the sampler's second tick)")
    out = Path(out_dir) if out_dir is not None else report_json.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = report_json.name.removesuffix(".json")
    x, xlabel = _time_axis(t)
    if report["series"].get("resumes_t_s"):
        xlabel = xlabel.replace("time since start", "running time, the run's starts back to back")
    paths = [out / f"{stem}.{name}.png" for name, _ in PLOTS]
    for path in paths:  # forge never writes over a file it did not write: only PNGs are replaced
        if (path.exists() or path.is_symlink()) and not is_png(path):
            raise ForgeError(f"{display_path(path)}: exists and is not a PNG; forge never writes "
                             "over a file "
                             "it did not write: choose another --out")
    for path, (name, draw) in zip(paths, PLOTS):
        draw(report, x, xlabel, path)
    return paths
