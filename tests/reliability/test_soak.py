"""Load and soak: many records through the whole `forge run` path (reader, broker, admission,
engine, ledger, writer), with the process's RSS and peak RSS (VmRSS, VmHWM) sampled from /proc. The
instant engine (no model) measures forge's own control plane; the real tiny engine runs the long
soak under --long."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from forge.constants import EXIT_ERROR_ROWS
from tests.reliability._rel import (
    ECHO,
    NODES,
    RssSampler,
    assert_complete,
    env,
    record_figures,
    run_argv,
    write_echo_input,
)


def soak(tmp: Path, n: int, *, node=NODES / "instant.yaml", sample_every_s: float = 0.05,
         env_extra=None, timeout_s: float = 600) -> dict:
    inp = write_echo_input(tmp / "in.jsonl", n, bad_every=1000)
    out = tmp / "out.jsonl"
    argv = run_argv(ECHO, inp, out, node)
    argv.remove("--no-report")
    t0 = time.monotonic()
    with open(tmp / "run.err", "w") as err:
        proc = subprocess.Popen(
            argv, env=env(**(env_extra or {})), stdout=subprocess.DEVNULL, stderr=err
        )
    sampler = RssSampler(proc.pid, sample_every_s)
    sampler.start()
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "soak run did not finish in time"
        time.sleep(0.05)
    wall = time.monotonic() - t0
    sampler.stop()
    # complete, with the planted errors
    assert proc.returncode == EXIT_ERROR_ROWS, (tmp / "run.err").read_text()
    ledger_path = out.with_name(out.name + ".ledger.sqlite")
    summary = assert_complete(out, ledger_path, n)
    report = json.loads(out.with_name(out.name + ".report.json").read_text())
    samples = sampler.samples
    # "flat": after the first quarter of the run (imports, engine, first batches) RSS may not keep
    # climbing
    warm = [k for t, k in samples if t >= wall * 0.25]
    return {
        "records": n,
        "wall_s": round(wall, 1),
        "records_per_s": round(n / wall),
        "peak_rss_mib": round(sampler.peak_kib / 1024, 1),
        "rss_after_warmup_mib": round(warm[0] / 1024, 1) if warm else None,
        "rss_growth_after_warmup_mib": round((max(warm) - warm[0]) / 1024, 1) if warm else None,
        "ledger_bytes": ledger_path.stat().st_size,
        "ledger_bytes_per_record": round(ledger_path.stat().st_size / n, 1),
        "output_bytes": out.stat().st_size,
        "ledger_commits": report["ledger"]["commits"],
        "ledger_rows_committed": report["ledger"]["rows_committed"],
        "ledger_row_changes_per_s": round(
            report["ledger"]["rows_committed"] / report["summary"]["wall_s"]
        ),
        "ledger_mean_commit_ms": round(report["ledger"]["mean_commit_s"] * 1000, 2),
        "error_rows": summary["errors"],
        "retried_records": summary["retried"],
        "requeued_requests": sum(c["requests"]["requeued"] for c in report["cards"]),
        "rss_series_mib": [
            (round(t, 1), round(k / 1024, 1)) for t, k in samples[:: max(1, len(samples) // 20)]
        ],
    }


@pytest.mark.timeout(120)
def test_soak_30k_records_instant_engine_rss_stays_flat(tmp_path):
    fig = soak(tmp_path, 30_000)
    record_figures("soak-30k-instant", **fig)
    assert fig["rss_growth_after_warmup_mib"] < 24, fig
    assert fig["peak_rss_mib"] < 300, fig


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_soak_1m_records_instant_engine(tmp_path):
    fig = soak(tmp_path, 1_000_000, sample_every_s=0.5, timeout_s=1100)
    record_figures("soak-1m-instant", **fig)
    assert fig["rss_growth_after_warmup_mib"] < 48, fig
    assert fig["peak_rss_mib"] < 400, fig


@pytest.mark.engine
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_soak_real_tiny_engine(tmp_path):
    n = int(os.environ.get("FORGE_SOAK_REAL_RECORDS", "50000"))       # ~4-5 minutes on 2 CPU cores
    fig = soak(tmp_path, n, node=None, sample_every_s=0.5, env_extra={"FORGE_TEST_MAX_TOKENS": "8"},
               timeout_s=1700)
    record_figures("soak-real-tiny", **fig)
    assert fig["rss_growth_after_warmup_mib"] < 64, fig
