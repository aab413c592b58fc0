import json

import click
import pytest
from click.testing import CliRunner

from forge.errors import UsageError
from forge.report import Sampler, write_report
from forge.report.plots import load_report, render_plots

from synthetic_run import SyntheticRun, drive

SUMMARY = {"command": "run", "function": "functions/summarize.py:summarize", "node": "fabric-a",
           "input": "items.jsonl", "output": "out.jsonl"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0, max_points=256)
    drive(sampler, sim)
    output = tmp_path_factory.mktemp("run") / "out.jsonl"
    output.write_text("")
    # the fake clock is done
    json_path, md_path = write_report(output, SUMMARY, sampler, final_sample=False)
    return sim, output, json_path, md_path


def test_report_sits_beside_the_output(written):
    _sim, output, json_path, md_path = written
    assert json_path == output.parent / "out.jsonl.report.json"
    assert md_path == output.parent / "out.jsonl.report.md"


def test_report_json_carries_totals_cards_and_bounded_series(written):
    sim, _output, json_path, _md = written
    report = json.loads(json_path.read_text())
    assert report["format"] == "forge-run-report" and report["version"] == 1
    assert report["summary"] == SUMMARY
    totals = report["totals"]
    assert totals["done"] == sim.run.done and totals["output_tokens"] == sim.run.output_tokens
    assert totals["wall_s"] == pytest.approx(600, abs=2)
    assert totals["tokens_per_s"] == pytest.approx(
        (sim.run.input_tokens + sim.run.output_tokens) / totals["wall_s"]
    )
    assert totals["stalls"] == 1 and totals["progress_only_steps"] == 1
    cards = {c["card"]: c for c in report["cards"]}
    assert sum(c["token_share"] for c in cards.values()) == pytest.approx(1.0)
    assert cards["gpu0"]["token_share"] > cards["gpu1"]["token_share"]  # the faster card did more
    assert 90_000 < cards["gpu0"]["peak_tokens_per_s"] < 130_000
    assert cards["gpu1"]["requests"]["requeued"] == 12
    assert 0.7 < cards["gpu0"]["mean_budget_use"] < 0.9       # mean tokens/step over the budget
    assert report["broker"]["prefix_reuse_ratio"] == pytest.approx(0.42, abs=0.01)
    assert report["ledger"]["mean_commit_s"] == pytest.approx(0.0025, abs=0.0006)
    series = report["series"]
    assert 100 < len(series["t_s"]) <= 256
    assert all(len(v) == len(series["t_s"]) for c in series["cards"] for v in c["series"].values())


def test_markdown_names_every_card_and_the_ratios(written):
    _sim, _output, _json, md_path = written
    md = md_path.read_text()
    assert "fabric-a/gpu0" in md and "fabric-a/gpu1" in md
    assert "| 42.0% |" in md                                 # prefix reuse
    # the path as the user can type it (absolute: not below cwd)
    assert f"forge report {_json}" in md


def test_plots_render_as_real_images(written, tmp_path):
    from matplotlib.image import imread

    _sim, _output, json_path, _md = written
    paths = render_plots(json_path, tmp_path / "plots")
    assert [p.name for p in paths] == [
        "out.jsonl.report.tokens-per-s.png",
        "out.jsonl.report.in-flight-queues.png",
        "out.jsonl.report.budget-kv.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert p.stat().st_size > 20_000
        pixels = imread(p)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 1000
        assert pixels[..., :3].std() > 0.05                    # not a blank canvas


def test_forge_report_command_finds_the_report_from_the_output_path(written, tmp_path):
    from forge.cli.report import register

    _sim, output, _json, _md = written
    group = click.Group()
    register(group)
    result = CliRunner().invoke(group, ["report", str(output), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 3 and all(line.endswith(".png") for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "out.jsonl.report.tokens-per-s.png",
            "out.jsonl.report.in-flight-queues.png",
            "out.jsonl.report.budget-kv.png",
        ]
    )


def test_a_run_directory_gets_forge_report_files(tmp_path):
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0)
    drive(sampler, sim, until_s=5)
    json_path, md_path = write_report(tmp_path, {}, sampler, final_sample=False)
    assert json_path == tmp_path / "forge.report.json" and md_path.exists()


def test_not_a_report_is_one_clear_line(tmp_path):
    bogus = tmp_path / "x.report.json"
    bogus.write_text('{"rows": []}')
    with pytest.raises(UsageError, match=r"x\.report\.json::\$\.format: not a forge run report"):
        load_report(bogus)
    bogus.write_text("{")
    with pytest.raises(UsageError, match=r"::\$: not JSON"):
        load_report(bogus)
    from forge.cli.report import find_report
    with pytest.raises(UsageError, match="missing.jsonl: no such output, report or folder"):
        find_report(str(tmp_path / "missing.jsonl"))
    (tmp_path / "there.jsonl").write_text("")
    with pytest.raises(UsageError, match="no run report found"):
        find_report(str(tmp_path / "there.jsonl"))
    with pytest.raises(UsageError, match=r"x.jsonl.report.json: no such run report"):
        find_report(str(tmp_path / "x.jsonl.report.md"))


def test_a_report_with_one_sample_cannot_be_plotted(tmp_path):
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0)
    sampler.sample(sim.now)
    json_path, _md = write_report(tmp_path / "o.jsonl", {}, sampler, final_sample=False)
    with pytest.raises(UsageError, match=r"::\$\.series\.t_s: 1 sample\(s\)"):
        render_plots(json_path)


def _keys(obj, prefix=""):
    """Every key path of a JSON object; lists are described by their first element."""
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            if (
                prefix.endswith("series.run")
                or prefix.endswith("series.broker")
                or prefix.endswith("].series")
            ):
                out.add(f"{prefix}.{k}")            # column names; their values are data
                continue
            out.add(f"{prefix}.{k}")
            if k != "summary":
                out |= _keys(v, f"{prefix}.{k}")
    elif isinstance(obj, list) and obj and isinstance(obj[0], dict):
        out |= _keys(obj[0], prefix + "[]")
    return out


def test_docs_describe_the_report_format_field_for_field(written):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    example = json.loads(
        re.search(r"### Report JSON, version 1\s+```json\n(.*?)```", doc, re.S).group(1)
    )
    real = json.loads(written[2].read_text())
    assert _keys(example) == _keys(real)


def test_write_report_takes_the_final_sample_on_the_real_clock(tmp_path):
    from forge.stats import RunStats

    run = RunStats(total=3)
    sampler = Sampler(run=lambda: run, interval_s=60.0)
    sampler.sample()
    run.done = 3                                          # the run finishes between strides
    json_path, _md = write_report(tmp_path / "o.jsonl", {}, sampler)
    report = json.loads(json_path.read_text())
    assert len(report["series"]["t_s"]) == 2 and report["series"]["run"]["done"] == [0.0, 3.0]
    assert report["totals"]["done"] == 3


def test_markdown_shows_a_time_as_a_date_not_a_number(tmp_path):
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0, max_points=256)
    drive(sampler, sim)
    output = tmp_path / "out.jsonl"
    output.write_text("")
    _, md_path = write_report(
        output, {**SUMMARY, "finished_at": 1_796_225_317.25}, sampler, final_sample=False
    )
    md = md_path.read_text()
    assert "| finished_at | 2026-12-02 " in md and " UTC |" in md, md
    assert "1,796,225,317" not in md
