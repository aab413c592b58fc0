"""`forge validate`, `forge schema`, `forge provision --dry-run`: their refusals, plans and exit
codes, in this process (tests/forge_cli.py::invoke runs `forge.cli.main` as the `forge` command
does); the first test runs the command as a user does, in a process of its own."""
from __future__ import annotations

import json

import pytest

from tests.config.conftest import REPO, node, trt_contract
from tests.forge_cli import forge as forge_process
from tests.forge_cli import invoke

CASES = REPO / "tests" / "cases"


def forge(*args, cwd=REPO, env=None):
    proc = invoke(*args, cwd=cwd, env=env)
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc


@pytest.mark.slow
def test_examples_are_valid():
    proc = forge_process("validate", "node_descriptions/", "engine_contracts/", timeout=60)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert "5 node(s), 6 contract(s): valid (0 error(s), 0 warning(s))" in proc.stderr


def test_examples_are_valid_in_process():
    proc = forge("validate", "node_descriptions/", "engine_contracts/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert "5 node(s), 6 contract(s): valid (0 error(s), 0 warning(s))" in proc.stderr


def test_invalid_files_exit_1_with_one_line_per_problem():
    case = CASES / "invalid" / "memory-and-slots"
    proc = forge("validate", ".", cwd=case)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("node.yaml::$.cards[") for line in lines)


def test_warnings_print_but_pass_unless_strict():
    case = CASES / "valid" / "slots-warning"
    proc = forge("validate", ".", cwd=case)
    assert proc.returncode == 0
    assert proc.stdout.startswith("node.yaml::$.cards[0].engine: warning: the KV pool of t1k")
    strict = forge("validate", "--strict", ".", cwd=case)
    assert strict.returncode == 1 and "warning:" not in strict.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("validate",),
        ("validate", "no/such/path.yaml"),
        ("validate", "--bogus", "."),
        ("schema", "--out", "x", "--check", "docs/schemas"),
    ],
)
def test_usage_errors_exit_2(args, tmp_path):
    assert forge(*args, cwd=tmp_path if args[0] == "validate" else REPO).returncode == 2


def test_hostile_file_is_one_line(tmp_path):
    (tmp_path / "bomb.yaml").write_text("a: &a [x]\n" + "".join(f"b{i}: *a\n" for i in range(100)))
    proc = forge("validate", "bomb.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["bomb.yaml::$: more than 64 YAML aliases (line 66, column "
                                        "6)"]


def test_provision_dry_run_prints_the_plan_per_card():
    proc = forge("provision", "node_descriptions/fabric-a.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for text in (
        "gpu0",
        "gpu1",
        "llama7b-fp8-1k-half",
        "trtllm",
        "7.20 GiB",
        "21.08 GiB",
        "10,792 x 32",
        "299",
        "3,829 x 32",
        "106",
        "8,192",
        "4,096",
        "full-length slots",
        "token budget",
    ):
        assert text in proc.stdout, text


@pytest.mark.parametrize(
    "node, backend, expected",
    [
        (
            "local-vllm",
            "vllm",
            {
                "max_num_batched_tokens": 512,
                "max_num_seqs": 32,
                "max_model_len": 512,
                "block_size": 32,
                "num_gpu_blocks_override": 512,
                "kv_cache_memory_bytes": 512 * 32 * 4096,
                "enable_prefix_caching": True,
                "generation_config": "vllm",
                "enforce_eager": True,
            },
        ),
        ("local", "transformers", {"dtype": "float32", "attn_implementation": "sdpa"}),
    ],
)
def test_provision_dry_run_prints_each_cards_engine_arguments(node, backend, expected):
    """The exact arguments forge hands the card's engine: with --wide one JSON object per card (and
    vLLM's environment); at 80 columns one `name: value` line per argument."""
    import json

    proc = forge("provision", node, "--dry-run", "--wide")
    assert proc.returncode == 0, proc.stderr
    prefix = (f"card cpu0 (tiny-llama-{'vllm' if backend == 'vllm' else 'cpu'}, backend {backend}) "
              "engine arguments: ")
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith(prefix)]
    args = json.loads(line[len(prefix):])
    assert {k: args[k] for k in expected} == expected
    if backend == "vllm":
        (env,) = [
            ln
            for ln in proc.stdout.splitlines()
            if ln.startswith("card cpu0 (tiny-llama-vllm, backend vllm) environment")
        ]
        assert json.loads(env.split("): ", 1)[1])["VLLM_CPU_KVCACHE_SPACE"] is None
    else:
        assert args["continuous_batching_config"]["num_blocks"] == 512
    narrow = forge("provision", node, "--dry-run", env={"COLUMNS": "80"})
    lines = narrow.stdout.splitlines()
    assert prefix.rstrip() in lines and all(len(ln) <= 80 for ln in lines)
    for k, v in expected.items():
        assert f"  {k}: {json.dumps(v)}" in lines


def test_provision_dry_run_shows_replicas_and_their_engines():
    proc = forge("provision", "tests/cases/valid/replicas/node.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    for text in ("1 card(s), 2 engine(s)", "replicas", "3,829 x 32", "106", "card memory",
                 "engines (one process each): gpu0.r0, gpu0.r1"):
        assert text in out, text


def test_provision_dry_run_shows_each_engines_working_memory_and_counts_it_on_the_card():
    """transformers builds an attention mask of max_num_tokens x (pool + max_num_tokens) elements
    beside weights and pool (here 8,192 x (294,912 + 8,192) x 4 bytes = 9.25 GiB): the plan shows it
    and the card's memory counts it."""
    proc = forge("provision", "docs/bench/cpu-proxy/node-cpu-llama-micro-g1p5b.yaml", "--dry-run",
                 env={"COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    for text in ("working memory", "9.25 GiB attention mask", "9.39 GiB of 12.00 GiB"):
        assert text in out, text


def test_provision_refuses_an_invalid_node(tmp_path):
    import yaml

    (tmp_path / "t1k.yaml").write_text(
        yaml.safe_dump(trt_contract(**{"limits.max_num_tokens": None}))
    )
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(node()))
    proc = forge("provision", "node.yaml", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 1
    assert "t1k.yaml::$.limits.max_num_tokens: missing required key" in proc.stderr


def test_schema_prints_writes_and_checks(tmp_path):
    printed = forge("schema")
    assert printed.returncode == 0 and set(json.loads(printed.stdout)) == {"node", "contract"}
    wrote = forge("schema", "--out", tmp_path / "s")
    assert wrote.returncode == 0
    for name in ("node.schema.json", "contract.schema.json"):
        assert (tmp_path / "s" / name).read_text() == (REPO / "docs" / "schemas" / name).read_text()
    assert forge("schema", "--check", "docs/schemas").returncode == 0
    (tmp_path / "s" / "node.schema.json").write_text("{}\n")
    stale = forge("schema", "--check", tmp_path / "s")
    assert stale.returncode == 1 and "node.schema.json: differs from the models" in stale.stdout
