"""`forge bench sweep` and `forge bench compare` as a user runs them, on the embedded tiny model
(CPU): every candidate a real child process on the real engine, skipped candidates with their
reasons, time limits that cut, SIGTERM that ends with a report, and a written winner that `forge
validate` accepts."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.forge_cli import forge, forge_argv, forge_env
from tests.installed import skip_module_unless_installed

pytestmark = pytest.mark.engine
skip_module_unless_installed("torch", "transformers")

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "bench" / "forge_bench" / "quick.yaml"
# Every dimension of the embedded tier left out but the token budget (and the GPU-only switches,
# which are skipped here anyway): a short sweep.
SHORT = ["--skip", "transformers.attn_implementation", "--skip", "transformers.compile_level",
         "--skip", "transformers.scheduler", "--skip", "limits.max_batch_size"]


def sweep_json(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


@pytest.mark.timeout(400)
def test_sweep_end_to_end_skips_with_reasons_and_writes_a_valid_winner(tmp_path):
    out = tmp_path / "s"
    best, node = tmp_path / "tiers" / "best.yaml", tmp_path / "tiers" / "best-node.yaml"
    proc = forge(
        "bench",
        "sweep",
        "tiny-llama-cpu",
        "--workload",
        QUICK,
        "--records",
        6,
        "--warmup",
        1,
        *SHORT,
        "--tokens",
        "256,768",
        "--confirm-repeat",
        1,
        "--deadline",
        330,
        "--out",
        out,
        "--write-best",
        best,
        "--write-best-node",
        node,
        "--best-name",
        "tiny-llama-cpu-swept",
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = sweep_json(out)
    cands = {c["key"]: c for c in data["candidates"]}
    assert cands["base"]["status"] == "ran" and cands["base"]["tokens_per_s"] > 0
    assert cands["limits.max_num_tokens=768"]["status"] == "ran"
    rule = cands["limits.max_num_tokens=256"]
    assert rule["status"] == "skipped" and "breaks a contract rule" in rule["reason"] \
        and "max_num_tokens 256 is below max_input_len 384" in rule["reason"]
    assert cands["transformers.use_cuda_graph=true"]["reason"] == "needs a GPU card"
    # one worker process per replica, through forge
    assert cands["card.replicas=2"]["status"] == "ran"
    assert (
        data["env"]["date"]
        and data["env"]["software"]["transformers"]
        and "bench sweep" in data["env"]["command"]
    )
    assert data["env"]["hardware"]["cpu"]
    # the confirm ran (the budget change won the sweep run) or had nothing to confirm (the shipped
    # tier won)
    assert data["confirm"]["status"] == "ran" or "nothing to confirm" in data["confirm"]["reason"]
    if data["confirm"]["status"] == "ran":
        assert (out / "confirm" / "compare.json").is_file() and data["confirm"]["ratio_mean"] > 0
    assert data["winner"]["key"] in ("base", "limits.max_num_tokens=768", "card.replicas=2")
    assert data["written"] == [str(best), str(node)]
    text = best.read_text()
    assert (
        "written by forge bench sweep" in text
        and "contract: tiny-llama-cpu-swept" in text
        and "# hardware:" in text
    )
    check = forge("validate", best, node, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    md = (out / "sweep.md").read_text()
    assert (
        "## Candidates" in md
        and "skipped" in md
        and "Winner" in md
        and (out / "sweep.png").is_file()
    )


@pytest.mark.timeout(200)
def test_a_deadline_and_a_candidate_limit_cut_and_the_report_says_so(tmp_path):
    out = tmp_path / "s"
    proc = forge(
        "bench",
        "sweep",
        "tiny-llama-cpu",
        "--workload",
        QUICK,
        "--records",
        4,
        "--warmup",
        1,
        *SHORT,
        "--tokens",
        "768",
        "--slots",
        "16",
        "--candidate-limit",
        1,
        "--deadline",
        10,
        "--out",
        out,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = sweep_json(out)
    cands = {c["key"]: c for c in data["candidates"]}
    assert cands["base"]["status"] == "cut" and "exceeded its 1 s limit" in cands["base"]["reason"]
    assert all(c["status"] in ("cut", "skipped") for c in data["candidates"])
    assert data["confirm"]["status"] == "skipped" and data["winner"]["key"] is None
    assert "0 ran" in (out / "sweep.md").read_text()
    refused = forge(
        "bench",
        "sweep",
        "tiny-llama-cpu",
        "--workload",
        QUICK,
        *SHORT,
        "--tokens",
        "768",
        "--candidate-limit",
        1,
        "--confirm-repeat",
        0,
        "--out",
        tmp_path / "w",
        "--write-best",
        tmp_path / "w.yaml",
        timeout=120,
    )
    assert refused.returncode == 1 and "--write-best: nothing to write" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.timeout(200)
def test_sigterm_ends_the_running_candidate_and_writes_the_report(tmp_path):
    psutil = pytest.importorskip("psutil")
    out = tmp_path / "s"
    proc = subprocess.Popen(
        forge_argv(
            "bench",
            "sweep",
            "tiny-llama-cpu",
            "--workload",
            QUICK,
            "--records",
            48,
            *SHORT,
            "--tokens",
            768,
            "--out",
            out,
        ),
        cwd=ROOT,
        env=forge_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        children = []
        while time.monotonic() < deadline and not children:
            time.sleep(0.2)
            children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the sweep never started a candidate"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "sweep stopped (SIGTERM)" in err, err[-2000:]
    for child in children:
        assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    data = sweep_json(out)
    assert data["candidates"][0]["status"] == "cut" and "SIGTERM" in data["candidates"][0]["reason"]


@pytest.mark.timeout(300)
def test_compare_interleaves_tiers_with_forge_and_direct(tmp_path):
    contract = (ROOT / "forge" / "embedded" / "tiny-llama-cpu.yaml").read_text()
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "c.yaml").write_text(
        contract.replace("max_num_tokens: 512", "max_num_tokens: 768").replace(
            "checkpoint: tiny-llama", f"checkpoint: {ROOT}/forge/embedded/tiny-llama"
        )
    )
    (tier / "n.yaml").write_text(
        (ROOT / "node_descriptions" / "local.yaml")
        .read_text()
        .replace("contracts: ../forge/embedded/tiny-llama-cpu.yaml", "contracts: [c.yaml]")
    )
    out = tmp_path / "c"
    proc = forge(
        "bench",
        "compare",
        QUICK,
        "--node",
        ROOT / "node_descriptions" / "local.yaml",
        "--node",
        tier / "n.yaml",
        "--label",
        "shipped",
        "--label",
        "wide",
        "--modes",
        "forge,direct",
        "--repeat",
        1,
        "--records",
        6,
        "--warmup",
        1,
        "--out",
        out,
        "--peak-tflops",
        1,
        "--hbm-tbps",
        0.05,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "compare.json").read_text())
    assert [(r["tier"], r["mode"]) for r in data["results"]] == [
        ("shipped", "forge"),
        ("shipped", "direct"),
        ("wide", "forge"),
        ("wide", "direct"),
    ]
    tiers = data["summary"]["tiers"]
    assert (
        tiers["shipped"]["forge_over_direct"] > 0
        and tiers["wide"]["forge_over_shipped"]["mean"] > 0
    )
    assert (
        tiers["wide"]["bounds"]["compute_s"] > 0 and data["contracts"]["wide"] == "tiny-llama-cpu"
    )
    md = (out / "compare.md").read_text()
    assert "forge ÷ direct" in md and "compute bound" in md
    bad = forge(
        "bench",
        "compare",
        QUICK,
        "--node",
        ROOT / "node_descriptions" / "local.yaml",
        "--label",
        "a",
        "--label",
        "b",
        timeout=60,
    )
    assert bad.returncode == 2 and "one distinct label per --node" in bad.stderr
