"""Pure: two /v1/stats snapshots -> what `forge top` shows (CardLine rows, then a rich renderable).

Rates come from deltas of the cumulative counters between the two snapshots, over the engines' own
timestamps, so HTTP latency does not skew them. Token counters move when a request finishes, so
tokens/s is *delivered* tokens/s (as in run reports), bursty at short intervals. Generated tokens/s
comes first (what engines and their benchmarks call tok/s), prompt tokens/s beside it. The runtime's
`tokens_per_s` (an EWMA that only moves while work is in flight: the broker's balancing signal) is
deliberately not used: an idle card must read 0 here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from forge.fit import Fit

BAR_WIDTH = 5


@dataclass(frozen=True)
class CardLine:
    node: str
    card: str
    tier: str
    healthy: bool
    # generated tokens delivered per second; None until two snapshots
    output_tokens_per_s: Optional[float]
    input_tokens_per_s: Optional[float]   # prompt tokens delivered per second
    budget_use: float  # the last step's tokens / token budget (0 when no step ran)
    token_budget: int
    in_flight: int
    slots: int
    kv_used: int
    kv_reserved: int
    kv_total: int
    engine_queued: int
    stalls: int                           # cumulative since the node started
    progress_only_steps: int              # cumulative
    requests_ok: int
    requests_failed: int


def _key(e: dict) -> tuple:
    return (e.get("node"), e.get("card"), e.get("tier"))


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def card_line(cur: dict, prev: Optional[dict]) -> CardLine:
    """One card from its current EngineStats dict and the previous one (None on the first frame)."""
    in_tps = out_tps = None
    budget = _ratio(cur.get("tokens_last_step", 0), cur.get("token_budget", 0))
    if prev is not None:
        dt = cur.get("timestamp", 0.0) - prev.get("timestamp", 0.0)
        d_in = cur.get("input_tokens", 0) - prev.get("input_tokens", 0)
        d_out = cur.get("output_tokens", 0) - prev.get("output_tokens", 0)
        if dt > 0 and d_in >= 0 and d_out >= 0:  # a negative delta is a restarted engine: no rate
            in_tps, out_tps = d_in / dt, d_out / dt
        if cur.get("engine_steps", 0) == prev.get("engine_steps", 0):
            budget = 0.0  # no step ran: the last step's figure is stale
    return CardLine(
        node=str(cur.get("node", "")),
        card=str(cur.get("card", "")),
        tier=str(cur.get("tier", "")),
        healthy=bool(cur.get("healthy", False)),
        output_tokens_per_s=out_tps,
        input_tokens_per_s=in_tps,
        budget_use=budget,
        token_budget=int(cur.get("token_budget", 0)),
        in_flight=int(cur.get("in_flight", 0)),
        slots=int(cur.get("slots", 0)),
        kv_used=int(cur.get("kv_blocks_used", 0)),
        kv_reserved=int(cur.get("kv_blocks_reserved", 0)),
        kv_total=int(cur.get("kv_blocks_total", 0)),
        engine_queued=int(cur.get("engine_queued", 0)),
        stalls=int(cur.get("stalls", 0)),
        progress_only_steps=int(cur.get("progress_only_steps", 0)),
        requests_ok=int(cur.get("requests_ok", 0)),
        requests_failed=int(cur.get("requests_failed", 0)),
    )


def card_lines(stats: dict, prev_stats: Optional[dict]) -> list[CardLine]:
    """Every card of the current snapshot, matched to the previous one by (node, card, tier)."""
    before = {_key(e): e for e in (prev_stats or {}).get("engines", [])}
    return [
        card_line(e, before.get(_key(e)) if prev_stats is not None else None)
        for e in stats.get("engines", [])
    ]


@dataclass(frozen=True)
class Frame:
    """Everything one screen shows."""

    url: str
    health: dict
    stats: dict
    prev_stats: Optional[dict] = None
    interval_s: float = 1.0
    problem: Optional[str] = None         # e.g. the node stopped answering (shown, while retrying)
    hint: str = ""                        # e.g. "Ctrl-C quits"


def bar(
    frac: float,
    width: int = BAR_WIDTH,
    warn_at: Optional[float] = None,
    label: Optional[str] = None,
) -> Text:
    """`████░  75%` (or the label instead of the percentage); red past warn_at, for pools that hurt
    when full (not budgets, which should be)."""
    filled = round(min(max(frac, 0.0), 1.0) * width)
    style = "red" if warn_at is not None and frac >= warn_at else "cyan"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"),
                         f" {frac * 100:3.0f}%" if label is None else f" {label}")


def _num(x: Optional[float]) -> str:
    return "…" if x is None else f"{x:,.0f}"


def _count(n: int, bad: bool) -> Text:
    return Text(f"{n:,}", style="bold red" if bad and n else "")


def header(frame: Frame, lines: list[CardLine]) -> Text:
    h, b = frame.health, frame.stats.get("broker", {})
    status = str(h.get("status", "?"))
    known = [c for c in lines if c.output_tokens_per_s is not None]
    full = known and len(known) == len(lines)
    generated = _num(sum(c.output_tokens_per_s for c in known)) if full else "…"
    prompt = _num(sum(c.input_tokens_per_s for c in known)) if full else "…"
    queue = int(b.get("pending", 0)) + sum(c.engine_queued for c in lines)
    out = Text.assemble(("forge top", "bold"), f"  node {h.get('node', '?')}  {frame.url}  ",
                        (status, "green" if status == "ok" else "bold red"),
                        f"  {len(lines)} card(s)  every {frame.interval_s:g} s\n",
                        f"generated {generated} tok/s · prompt {prompt} tok/s   queue depth "
                        f"{queue:,} (broker {int(b.get('pending', 0)):,})   "
                        f"dispatched {int(b.get('dispatched', 0)):,}   no-fit "
                        f"{int(b.get('no_fit', 0)):,}   "
                        f"padding {float(b.get('padding_ratio', 0.0)) * 100:.1f}%   "
                        f"prefix reuse {float(b.get('prefix_reuse_ratio', 0.0)) * 100:.1f}%")
    if frame.problem:
        out.append(f"\n{frame.problem}", style="bold red")
    return out


COMPACT_BAR_WIDTH = 3
COMPACT_COLUMNS = ("card", "tier", "health", "gen/s", "budget", "slots", "KV used", "queue")


def compact_table(lines: list[CardLine]) -> RenderableType:
    """The columns that matter most, for a terminal narrower than table() (80 columns hold it);
    stalls and failures are said below it, on a line per card that has any."""
    t = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for name in COMPACT_COLUMNS:
        t.add_column(name, justify="right" if name in ("gen/s", "queue") else "left", no_wrap=True)
    for c in lines:
        t.add_row(
            c.card,
            c.tier,
            Text("ok", "green") if c.healthy else Text("DOWN", "bold red"),
            _num(c.output_tokens_per_s),
            bar(c.budget_use, COMPACT_BAR_WIDTH),
            bar(_ratio(c.in_flight, c.slots), COMPACT_BAR_WIDTH, label=f"{c.in_flight}/{c.slots}"),
            bar(_ratio(c.kv_used, c.kv_total), COMPACT_BAR_WIDTH, warn_at=0.9),
            f"{c.engine_queued:,}",
        )
    notes = [Text(f"{c.card}: {c.stalls:,} stalls, {c.progress_only_steps:,} progress-only steps, "
                  f"{c.requests_failed:,} failed", style="bold red")
             for c in lines if c.stalls or c.progress_only_steps or c.requests_failed]
    return Group(t, *notes) if notes else t


def table(lines: list[CardLine]) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for name in (
        "card",
        "tier",
        "health",
        "gen/s",
        "prompt/s",
        "budget",
        "slots",
        "KV used",
        "KV rsv",
        "queue",
        "stalls",
        "prog-only",
        "ok",
        "failed",
    ):
        t.add_column(
            name,
            justify="left"
            if name in ("card", "tier", "health", "budget", "slots", "KV used")
            else "right",
            no_wrap=True,
        )
    for c in lines:
        t.add_row(c.card, c.tier, Text("ok", "green") if c.healthy else Text("DOWN", "bold red"),
                  _num(c.output_tokens_per_s), _num(c.input_tokens_per_s), bar(c.budget_use),
                  bar(_ratio(c.in_flight, c.slots), label=f"{c.in_flight}/{c.slots}"),
                  bar(_ratio(c.kv_used, c.kv_total), warn_at=0.9),
                  f"{_ratio(c.kv_reserved, c.kv_total) * 100:.0f}%", f"{c.engine_queued:,}",
                  _count(c.stalls, True), _count(c.progress_only_steps, True), f"{c.requests_ok:,}",
                  _count(c.requests_failed, True))
    return t


def render(frame: Frame) -> RenderableType:
    lines = card_lines(frame.stats, frame.prev_stats)
    parts: list[RenderableType] = [header(frame, lines), Text(""),
                                   Fit(table(lines), lambda: compact_table(lines)) if lines
                                   else Text("no cards are serving on this node", "yellow")]
    if frame.hint:
        parts += [Text(""), Text(frame.hint, style="dim")]
    return Group(*parts)
