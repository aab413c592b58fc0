"""`forge provision --dry-run`, `forge status` and `forge top` fit 80 columns (COLUMNS=80, as a
terminal of that width), print every column with --wide, and an idle node's throughput reads 0 in
both status and top. A real node provisioned in a subprocess, after a real job."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.reliability._rel import REPO, assert_no_traceback

pytestmark = pytest.mark.engine


def _forge(*args, env, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "forge", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _width(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


@pytest.mark.parametrize("desc", ["node_descriptions/local.yaml", "node_descriptions/fabric-a.yaml",
                                  "tests/cases/valid/replicas/node.yaml"])
def test_dry_run_fits_80_columns_and_wide_has_every_column(desc):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    narrow = _forge("provision", desc, "--dry-run", env={**env, "COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    assert _width(narrow.stdout) <= 80, narrow.stdout
    assert "…" not in narrow.stdout
    assert (
        "token budget" in narrow.stdout
        and "full-length slots" in narrow.stdout
        and "card memory" in narrow.stdout
    )
    wide = _forge("provision", desc, "--dry-run", "--wide", env={**env, "COLUMNS": "80"})
    assert wide.returncode == 0 and _width(wide.stdout) > 80
    header = next(line for line in wide.stdout.splitlines() if "card" in line and "backend" in line)
    for col in (
        "model",
        "engine",
        "backend",
        "replicas",
        "weights",
        "KV pool",
        "blocks",
        "full-length slots",
        "token budget",
        "slots",
        "working memory",
        "card memory",
    ):
        assert col in header, col


@pytest.mark.timeout(300)
def test_status_and_top_fit_80_columns_and_idle_reads_zero(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_HOME": str(tmp_path / "home"),
        "PYTHONUNBUFFERED": "1",
    }
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "provision",
            "local",
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 120
            time.sleep(0.1)
        r = _forge(
            "deploy",
            "functions/summarize.py",
            "--input",
            "functions/data/summarize.jsonl",
            "--output",
            tmp_path / "out.jsonl",
            "--progress",
            "off",
            "--no-report",
            env=env,
            timeout=240,
        )
        assert r.returncode == 0, r.stderr
        [entry] = json.loads(_forge("status", "--json", env=env).stdout)
        card = entry["live"]["cards"][0]
        # the runtime's rates keep their last values
        assert card["tokens_per_s"] > card["output_tokens_per_s"] > 0

        narrow = _forge("status", env={**env, "COLUMNS": "80"})
        assert narrow.returncode == 0, narrow.stderr
        table = narrow.stdout.split("\nlocal: pid")[0]
        assert _width(table) <= 80 and "…" not in table, narrow.stdout
        [row] = [line for line in table.splitlines() if "cpu0" in line]
        # nothing in flight, and so 0 generated tok/s
        assert row.replace("│", " ").split()[-2:] == ["0", "0"], row
        wide = _forge("status", "--wide", env={**env, "COLUMNS": "80"})
        assert "backend" in wide.stdout and "transformers" in wide.stdout

        top = _forge("top", "--once", "--interval", "0.5", env={**env, "COLUMNS": "80"})
        assert top.returncode == 0, top.stderr
        assert _width(top.stdout) <= 80 and "…" not in top.stdout.replace(
            "generated … tok/s · prompt … tok/s", ""
        ), top.stdout
        [row] = [line for line in top.stdout.splitlines() if line.startswith("cpu0")]
        assert row.split()[3] == "0", row  # generated tok/s of an idle card
        top_wide = _forge(
            "top", "--once", "--interval", "0.5", "--wide", env={**env, "COLUMNS": "80"}
        )
        assert "prog-only" in top_wide.stdout and _width(top_wide.stdout) > 80
        for out in (narrow, wide, top, top_wide):
            assert_no_traceback(out.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
