"""A resumed run's report continues the one its earlier start wrote: counts add up, the series sit
back to back, bounded like the sampler's, and only a report of the same run (ledger identity) is
continued."""
import json

import pytest

from forge.report import Sampler, write_report
from forge.report.plots import render_plots

from synthetic_run import SyntheticRun, drive

SUMMARY = {
    "function": "f",
    "node": "fabric-a",
    "input": "in.jsonl",
    "output": "out.jsonl",
    "records_total": 200_000,
    "records_resumed": 0,
    "retried": 0,
    "requeued": 0,
    "interrupted": None,
    "cards": [],
}


def _report(output, until_s: float, *, run_id="r1", resumed=False, summary=None, max_points=256):
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0, max_points=max_points)
    drive(sampler, sim, until_s)
    s = {
        **SUMMARY,
        "records_done": sim.run.done,
        "records_failed": 0,
        "input_tokens": sim.run.input_tokens,
        "output_tokens": sim.run.output_tokens,
        "wall_s": sim.now - sim.t0,
        **(summary or {}),
    }
    json_path, md_path = write_report(
        output, s, sampler, final_sample=False, run_id=run_id, resumed=resumed
    )
    return sim, json.loads(json_path.read_text()), md_path


def test_a_resumed_run_report_adds_up_both_starts(tmp_path):
    out = tmp_path / "out.jsonl"
    first_sim, first, _ = _report(out, 120, summary={"interrupted": "SIGINT"})
    second_sim, merged, md = _report(
        out, 200, resumed=True, summary={"records_resumed": first_sim.run.done, "retried": 7}
    )
    s, t = merged["summary"], merged["totals"]
    assert s["records_done"] == first_sim.run.done + second_sim.run.done
    assert s["records_resumed"] == 0 and s["retried"] == 7  # settled before the first start: none
    assert s["wall_s"] == pytest.approx(320) and t["wall_s"] == pytest.approx(320)
    assert t["done"] == first["totals"]["done"] + second_sim.run.done
    assert t["input_tokens"] == first_sim.run.input_tokens + second_sim.run.input_tokens
    assert t["tokens_per_s"] == pytest.approx((t["input_tokens"] + t["output_tokens"]) / 320)
    assert [r["interrupted"] for r in merged["runs"]] == ["SIGINT", None]
    cards = {c["card"]: c for c in merged["cards"]}
    assert cards["gpu0"]["input_tokens"] == sum(
        sim.engines["gpu0"].input_tokens for sim in (first_sim, second_sim)
    )
    assert sum(c["token_share"] for c in cards.values()) == pytest.approx(1.0)
    assert cards["gpu0"]["prefix_hit_ratio"] == pytest.approx(0.4, abs=0.01)
    assert merged["broker"]["prefix_reuse_ratio"] == pytest.approx(0.42, abs=0.01)
    series = merged["series"]
    assert series["resumes_t_s"] == [first["series"]["t_s"][-1]]
    assert series["t_s"] == sorted(series["t_s"]) and series["t_s"][-1] == pytest.approx(320, abs=2)
    assert all(len(v) == len(series["t_s"]) for c in series["cards"] for v in c["series"].values())
    text = md.read_text()
    assert "## Runs" in text and "\n| 2 | " in text and "| SIGINT |" in text

    _sim, third, _ = _report(out, 30, resumed=True)  # a third start continues the merged one
    assert len(third["runs"]) == 3 and len(third["series"]["resumes_t_s"]) == 2
    assert third["totals"]["wall_s"] == pytest.approx(350)


def test_merged_series_keep_the_sampler_bound(tmp_path):
    out = tmp_path / "out.jsonl"
    _report(out, 600, max_points=256)
    _sim, merged, _ = _report(out, 600, resumed=True, max_points=256)
    assert len(merged["series"]["t_s"]) <= 2048
    _sim, first, _ = _report(tmp_path / "b.jsonl", 1100, max_points=2048)  # 1,101 points each
    _sim, merged, _ = _report(tmp_path / "b.jsonl", 1100, resumed=True, max_points=2048)
    assert (
        len(merged["series"]["t_s"]) <= 2048
        and merged["series"]["stride_s"] == 2 * first["series"]["stride_s"]
    )


def test_only_the_same_run_is_continued(tmp_path):
    out = tmp_path / "out.jsonl"
    _report(out, 100)
    _sim, other, _ = _report(out, 50, run_id="r2", resumed=True)       # a --restart made a new run
    assert "runs" not in other and other["totals"]["wall_s"] == pytest.approx(50)
    _sim, fresh, _ = _report(out, 40, run_id="r2", resumed=False)
    assert "runs" not in fresh


def test_plots_beside_a_report_are_drawn_again_with_it(tmp_path):
    out = tmp_path / "out.jsonl"
    _report(out, 100)
    pngs = render_plots(tmp_path / "out.jsonl.report.json")
    before = {p: p.read_bytes() for p in pngs}
    _report(out, 60, resumed=True)
    # not the first start's plots
    assert all(p.exists() and p.read_bytes() != before[p] for p in pngs)
