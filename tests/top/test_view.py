"""forge.top.view: rates from counter deltas, budget/slots/KV fractions, the rendered screen."""
from __future__ import annotations

import io

from rich.console import Console

from forge.top.view import Frame, bar, card_line, card_lines, render

BASE = {
    "node": "local",
    "card": "cpu0",
    "tier": "tiny-llama-cpu",
    "token_budget": 512,
    "slots": 32,
    "kv_blocks_total": 512,
    "timestamp": 100.0,
    "in_flight": 8,
    "kv_blocks_reserved": 128,
    "kv_blocks_used": 64,
    "kv_blocks_free": 448,
    "engine_queued": 3,
    "tokens_last_step": 128,
    "input_tokens": 1000,
    "output_tokens": 200,
    "requests_ok": 10,
    "requests_failed": 1,
    "stalls": 2,
    "progress_only_steps": 5,
    "healthy": True,
    "tokens_per_s": 9999.0,
    "engine_steps": 40,
}


def snap(**changes) -> dict:
    return {**BASE, **changes}


def screen(frame: Frame, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(render(frame))
    return console.export_text()


def test_rates_are_counter_deltas_over_the_engine_timestamps():
    prev = snap()
    cur = snap(timestamp=102.0, input_tokens=1600, output_tokens=400, engine_steps=50)
    line = card_line(cur, prev)
    assert line.output_tokens_per_s == 200 / 2.0           # generated
    assert line.input_tokens_per_s == 600 / 2.0            # prompt
    assert line.budget_use == 128 / 512


def test_first_frame_has_no_rate_and_ignores_the_runtime_ewma():
    line = card_line(snap(), None)
    assert line.input_tokens_per_s is None and line.output_tokens_per_s is None
    assert line.budget_use == 128 / 512


def test_idle_card_reads_zero_not_its_stale_last_step():
    line = card_line(snap(timestamp=101.0), snap())
    assert line.output_tokens_per_s == 0.0 and line.input_tokens_per_s == 0.0
    assert line.budget_use == 0.0


def test_restarted_engine_gives_no_rate_instead_of_a_negative_one():
    line = card_line(
        snap(timestamp=101.0, input_tokens=10, output_tokens=5, engine_steps=1), snap()
    )
    assert line.output_tokens_per_s is None and line.input_tokens_per_s is None


def test_cards_are_matched_by_identity_not_position():
    a, b = snap(card="gpu0"), snap(card="gpu1", input_tokens=0, output_tokens=0)
    prev = {"engines": [a, b], "broker": {}}
    cur = {
        "engines": [
            snap(card="gpu1", timestamp=101.0, input_tokens=50, output_tokens=20),
            snap(card="gpu0", timestamp=101.0),
            snap(card="gpu2", timestamp=101.0),
        ],
        "broker": {},
    }
    lines = {c.card: c for c in card_lines(cur, prev)}
    assert lines["gpu1"].output_tokens_per_s == 20.0 and lines["gpu1"].input_tokens_per_s == 50.0
    assert lines["gpu0"].output_tokens_per_s == 0.0
    assert lines["gpu2"].output_tokens_per_s is None        # new card: no previous snapshot yet


def test_bar_clamps_and_warns():
    assert bar(0.5, width=4).plain == "██░░  50%"
    assert bar(1.7, width=4).plain == "████ 170%"
    assert bar(-1, width=4).plain == "░░░░ -100%"
    assert bar(0.95, width=4, warn_at=0.9).spans[0].style == "red"
    assert bar(0.25, width=4, label="8/32").plain == "█░░░ 8/32"


def test_screen_shows_every_figure_of_a_card():
    prev = {"engines": [snap()], "broker": {}}
    cur = {
        "engines": [snap(timestamp=101.0, input_tokens=2000, output_tokens=700, engine_steps=60)],
        "broker": {
            "pending": 4,
            "dispatched": 30,
            "no_fit": 0,
            "padding_ratio": 0.05,
            "prefix_reuse_ratio": 0.25,
        },
    }
    text = screen(Frame("http://127.0.0.1:1234", {"node": "local", "status": "ok"}, cur, prev, 1.0,
                        hint="Ctrl-C quits"))
    assert "node local  http://127.0.0.1:1234  ok  1 card(s)" in text
    # generated tokens/s first, prompt tokens/s beside it (500 and 1,000 over the second between the
    # snapshots)
    assert (
        "generated 500 tok/s · prompt 1,000 tok/s   queue depth 7 (broker 4)   dispatched 30"
        in text
    )
    assert "prefix reuse 25.0%" in text
    row = next(line for line in text.splitlines() if line.startswith("cpu0"))
    for cell in ("tiny-llama-cpu", "ok", "500", "1,000", " 25%", "8/32", " 12%", "25%"):
        assert cell in row, (cell, row)
    assert row.split()[3:5] == ["500", "1,000"]               # gen/s, then prompt/s
    assert row.split()[-5:] == ["3", "2", "5", "10", "1"]    # queue, stalls, prog-only, ok, failed
    assert text.rstrip().endswith("Ctrl-C quits")


def test_screen_flags_a_down_card_a_degraded_node_and_a_problem():
    cur = {"engines": [snap(healthy=False)], "broker": {}}
    text = screen(Frame("http://x", {"node": "n", "status": "degraded"}, cur, None,
                        problem="node n at http://x is unreachable (retrying)"))
    assert "degraded" in text and "DOWN" in text and "is unreachable (retrying)" in text
    assert "generated … tok/s · prompt … tok/s" in text


def test_a_node_without_cards_says_so():
    text = screen(
        Frame("http://x", {"node": "n", "status": "degraded"}, {"engines": [], "broker": {}})
    )
    assert "no cards are serving on this node" in text
