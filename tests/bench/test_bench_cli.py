"""`forge bench` as a user runs it, on the embedded tiny model (CPU): quick mode writes JSON,
Markdown and PNG reports for the three modes, the tier sweep and the control plane."""
from __future__ import annotations

import json

import pytest

from tests.forge_cli import forge, invoke


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(300)
def test_quick_mode_writes_every_report(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    # Four nodes start (forge, fifo, the sweep's one change, the control plane), each card in a
    # fresh worker process that imports torch and transformers again: ~5 s each on the 2-core
    # machine, more under load.
    proc = forge("bench", "quick", "--out", tmp_path, "--records", 8, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # what the quick figure is and is not, and where each report is (only the first is printed
    # whole)
    assert "the quick figures are a smoke check, not a measurement" in proc.stderr
    for name in ("bench.md", "sweep.md", "control-plane.md"):
        assert f"forge bench: report: {tmp_path / name}" in proc.stderr, name
    for name in ("bench.json", "bench.md", "bench.png", "sweep.json", "sweep.md", "sweep.png",
                 "control-plane.json", "control-plane.md"):
        assert (tmp_path / name).is_file() and (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    bench = json.loads((tmp_path / "bench.json").read_text())
    modes = [(r["mode"], r["variant"]) for r in bench["results"]]
    assert modes == [
        ("direct", "sorted"),
        ("direct", "depth:32"),
        ("forge", "grouped"),
        ("fifo", "fifo"),
    ]
    for r in bench["results"]:
        assert r["completed"] == r["requests"] == 8 and r["tokens_per_s"] > 0 and r["window_s"] > 0
        # every mode counts the engine's steps over its window (8 requests of >= 1 token: at least
        # one step)
        assert r["engine_steps"] >= 1 and r["ms_per_step"] == pytest.approx(
            1000 * r["window_s"] / r["engine_steps"], rel=1e-2
        )
    assert len({r["input_tokens"] for r in bench["results"]}) == 1  # the same work in every mode
    # each window's wall-clock start, in run order and windows apart (what lines a run up with other
    # records)
    starts = [r["started_at"] for r in bench["results"]]
    assert all(isinstance(t, float) for t in starts) and starts == sorted(starts)
    assert all(b - a >= r["window_s"] for a, b, r in zip(starts, starts[1:], bench["results"]))
    assert bench["ratios"]["forge_over_direct"] > 0 and bench["ratios"]["forge_over_fifo"] > 0
    assert bench["env"]["software"]["transformers"] and bench["env"]["date"]
    md = (tmp_path / "bench.md").read_text()
    assert "forge ÷ direct" in md and "forge bench quick" in md
    # no datasheet for a CPU
    assert "Bounds of the hardware: no peak figures for card model 'cpu'" in md

    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert [(c["key"], c["status"]) for c in sweep["candidates"]] == [
        ("base", "ran"),
        ("limits.max_num_tokens=768", "ran"),
    ]
    assert sweep["winner"]["key"] in ("base", "limits.max_num_tokens=768")
    # the shipped tier is not run twice: the sweep's base is the forge mode's result, on the same 8
    # records
    base, change = sweep["candidates"]
    assert base["result"] == next(r for r in bench["results"] if r["mode"] == "forge"), base
    assert "measured by the forge mode of" in base["reason"] and base["wall_s"] is None
    assert change["result"]["requests"] == 8
    assert (
        sweep["confirm"]["status"] == "skipped"
        and "bench quick` runs none" in sweep["confirm"]["reason"]
    )

    cp = json.loads((tmp_path / "control-plane.json").read_text())["control_plane"]
    assert cp["runs"][0]["completed"] == cp["records"] and cp["best_tasks_per_s"] > 0
    assert "no model" in (tmp_path / "control-plane.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_control_plane_runs_the_full_path_with_the_instant_engine(tmp_path):
    proc = forge("bench", "control-plane", "--records", 1500, "--repeat", 1, "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cp = json.loads((tmp_path / "control-plane.json").read_text())["control_plane"]
    run = cp["runs"][0]
    assert run["completed"] == 1500 and run["failed"] == 0 and cp["pinned_core"] == 0
    out_rows = (tmp_path / "work" / "control-plane.out.jsonl").read_text().splitlines()
    assert len(out_rows) == 1500  # every task went through the ledger into the output
    assert "This measures forge, not an engine" in (tmp_path / "control-plane.md").read_text()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("bench", "run", "docs/bench/workloads/gpu-mixed.yaml"),
            "do not fit contract tiny-llama-cpu",
        ),
        (
            ("bench", "run", "bench/forge_bench/quick.yaml", "--modes", "direct,turbo"),
            "unknown mode(s) turbo",
        ),
        (
            ("bench", "run", "bench/forge_bench/quick.yaml", "--direct", "deep"),
            "unknown variant 'deep'",
        ),
        (("bench", "run", "node_descriptions/local.yaml"), "local.yaml::$.node: unknown key"),
        (
            (
                "bench",
                "run",
                "bench/forge_bench/quick.yaml",
                "--modes",
                "forge",
                "--direct-process",
                "child",
            ),
            "--direct-process child: applies to the direct mode, and --modes has none",
        ),
        (
            (
                "bench",
                "run",
                "bench/forge_bench/quick.yaml",
                "--node",
                "docs/bench/h200x2/node-equal-1p5b.yaml",
                "--direct-process",
                "child",
            ),
            "--direct-process: this node has several cards",
        ),
    ],
)
def test_bad_invocations_get_one_line(tmp_path, args, message):
    proc = invoke(*args, "--out", tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
