"""`forge contract new` through the CLI on the embedded tiny-llama checkpoint: the written contract
is what `forge validate` accepts and `forge provision --dry-run` plans, its numbers are the plan's,
and a node made from it runs records on the real transformers engine. Only that run needs a process
of its own; the rest runs in-process."""
import json
import re
import shutil

import pytest

from forge.config.load import load_node
from tests.forge_cli import fill_in, invoke
from tests.reliability._rel import REPO, assert_no_traceback, forge

TINY = REPO / "forge" / "embedded" / "tiny-llama"


def _new(tmp_path, *extra, out="c.yaml", node="node.yaml"):
    args = ["contract", "new", TINY, "--out", tmp_path / out, *extra]
    if node:
        args += ["--node-out", tmp_path / node]
    return invoke(*args)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_contract_from_the_model_validates_plans_and_runs(tmp_path):
    r = _new(
        tmp_path,
        "--card",
        "cpu",
        "--memory-gib",
        "0.25",
        "--max-input-len",
        "256",
        "--max-output-len",
        "64",
    )
    assert r.returncode == 0, r.stderr
    assert_no_traceback(r.stderr)
    text = (tmp_path / "c.yaml").read_text()
    # every field explicit, each number with the reason
    for line in (
        "num_layers: 4",
        "num_kv_heads: 4",
        "head_dim: 32",
        "vocab_size: 2048",
        "weights_gib: 0.011",
        "max_input_len: 256",
        "max_output_len: 64",
        "max_num_tokens: 512",
        "tokens_per_block: 32",
        "host_cache_size: 0",
        "block_reuse: true",
        "attn_implementation: \"sdpa\"",
    ):
        assert line in text, line
    assert ("2,885,888 parameters (model.safetensors header; config.json's geometry gives "
            "2,885,888, the same) x 4 "
            "bytes (fp32)") in text
    assert re.search(r"max_tokens: \d+ +# the largest pool of whole blocks within 0.9 x", text)

    # what the user states of their machine
    fill_in(tmp_path / "node.yaml", memory_gib=8, cpu_cores=2)
    v = invoke("validate", tmp_path / "c.yaml", tmp_path / "node.yaml")
    assert v.returncode == 0 and "valid (0 error(s), 0 warning(s))" in v.stderr, v.stdout + v.stderr

    loaded = load_node(tmp_path / "node.yaml")
    plan = loaded.plans[0]
    c = plan.contract
    assert f"max_tokens: {plan.kv_pool_tokens}" in text
    assert (
        f"max_batch_size: {c.limits.max_batch_size} " in text
        and c.limits.max_batch_size == plan.full_length_slots
    )
    assert plan.fits_memory

    d = invoke("provision", tmp_path / "node.yaml", "--dry-run", env={"COLUMNS": "250"})
    assert d.returncode == 0, d.stderr
    assert f"{plan.num_blocks:,} x 32" in d.stdout and "tiny-llama-cpu" in d.stdout

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": f"record {i}"}) + "\n" for i in range(3)))
    run = forge(
        "run",
        REPO / "functions" / "summarize.py",
        "--node",
        tmp_path / "node.yaml",
        "--input",
        inp,
        "--output",
        tmp_path / "out.jsonl",
        "--progress",
        "off",
        "--no-report",
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_a_gpu_contract_is_bf16_and_names_its_capability(tmp_path):
    r = _new(
        tmp_path,
        "--card",
        "gpu",
        "--memory-gib",
        "80",
        "--compute-capability",
        "9.0",
        "--slots",
        "64",
        "--budget",
        "4096",
    )
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "c.yaml").read_text()
    assert (
        "weights: bf16" in text and "kv_cache: bf16" in text and 'compute_capability: "9.0"' in text
    )
    assert "max_batch_size: 64 " in text and "max_num_tokens: 4096 " in text and "# --slots" in text
    fill_in(tmp_path / "node.yaml", memory_gib=256, cpu_cores=32, model='"NVIDIA H100 80GB HBM3"')
    v = invoke("validate", tmp_path / "c.yaml", tmp_path / "node.yaml")
    assert v.returncode == 0, v.stdout + v.stderr


def test_refusals_are_one_line(tmp_path):
    r = _new(tmp_path, "--card", "gpu", "--memory-gib", "80", node=None)
    assert r.returncode == 1 and "--card gpu needs --compute-capability" in r.stderr
    (tmp_path / "c.yaml").write_text("mine\n")
    r = _new(tmp_path, "--card", "cpu", "--memory-gib", "1", node=None)
    assert r.returncode == 1 and "c.yaml: exists; --out never writes over a file" in r.stderr
    assert (tmp_path / "c.yaml").read_text() == "mine\n"
    r = _new(tmp_path, "--card", "cpu", "--memory-gib", "0.01", out="small.yaml", node=None)
    assert r.returncode == 1 and "the weights alone (11.26 MiB, fp32) do not fit" in r.stderr, (
        r.stderr
    )
    assert not (tmp_path / "small.yaml").exists()
    bare = tmp_path / "bare"
    shutil.copytree(TINY, bare)
    (bare / "config.json").unlink()
    r = invoke(
        "contract", "new", bare, "--card", "cpu", "--memory-gib", "1", "--out", tmp_path / "x.yaml"
    )
    assert r.returncode == 1 and "config.json" in r.stderr
    for res in (r,):
        assert_no_traceback(res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
