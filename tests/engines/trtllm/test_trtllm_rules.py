"""TensorRT-LLM's checks of a contract file come from its Backend object (contract_rules,
artifact_checks), never from forge/config: they run in their place among forge's own rules of one
file, and a registry without them has none of them."""
from __future__ import annotations

import yaml

from forge import backends
from forge.config.load import load_paths
from forge.config.registry import build, from_plugins
from forge.engines.trtllm import rules

CONTRACT = {
    "contract": "trt-order",
    "backend": "trtllm",
    "model": {
        "architecture": "LlamaForCausalLM",
        "num_layers": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 32000,
        "weights_gib": 7.2,
    },
    "artifact": {"engine_dir": "no-such-engine"},
    "precision": {"weights": "bf16", "kv_cache": "bf16"},
    "limits": {
        "max_batch_size": 256,
        "max_num_tokens": 512,
        "max_input_len": 1024,
        "max_output_len": 128,
    },
    "kv_cache": {
        "tokens_per_block": 32,
        "free_gpu_memory_fraction": 0.85,
        "host_cache_size": "1GiB",
        "block_reuse": False,
    },
    "target": {"kind": "cpu"},
}


def test_the_backend_object_carries_the_contract_file_checks():
    b = backends.get("trtllm")
    assert b.contract_rules == (rules.gpu_target_and_engine_dir,)
    assert b.artifact_checks == (rules.engine_dir_matches,)
    reg = from_plugins()
    assert (
        rules.gpu_target_and_engine_dir in reg.contract_rules
        and rules.engine_dir_matches in reg.artifact_checks
    )


def test_contract_file_checks_keep_their_place_among_forges_rules(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONTRACT), encoding="utf-8")
    (tmp_path / "v.yaml").write_text(
        yaml.safe_dump(
            dict(
                CONTRACT,
                contract="vllm-engine-dir",
                backend="vllm",
                limits=dict(CONTRACT["limits"], max_num_tokens=8192),
                artifact={"engine_dir": "no-such-engine", "tokenizer": "no-such-tok"},
            )
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    rendered = [p.render() for p in load_paths(["c.yaml", "v.yaml"]).problems]
    missing = tmp_path / "no-such-engine"
    assert rendered[:9] == [
        "c.yaml::$.limits.max_num_tokens: max_num_tokens 512 is below max_input_len 1024: a "
        "full-length prompt could "
        "never be scheduled in one step",
        "c.yaml::$.target.kind: TensorRT-LLM runs only on NVIDIA GPUs; the target must be gpu",
        "c.yaml::$.artifact.tokenizer: a TensorRT-LLM engine directory holds no tokenizer; name "
        "the tokenizer "
        "directory",
        "c.yaml::$.kv_cache.host_cache_size: warning: a host cache only holds reusable blocks; "
        "with block_reuse false "
        "it is allocated and never used",
        f"c.yaml::$.artifact.engine_dir: engine directory {missing} does not exist",
        "v.yaml::$.artifact.engine_dir: an engine directory is a TensorRT-LLM artifact; backend "
        "vllm loads a "
        "checkpoint",
        "v.yaml::$.kv_cache.host_cache_size: warning: a host cache only holds reusable blocks; "
        "with block_reuse false "
        "it is allocated and never used",
        f"v.yaml::$.artifact.engine_dir: engine directory {missing} does not exist",
        f"v.yaml::$.artifact.tokenizer: tokenizer directory {tmp_path / 'no-such-tok'} does not "
        "exist",
    ]
    bare = load_paths(["c.yaml"], registry=build([("trtllm", None)], [], []))
    assert [p.path for p in bare.problems] == [
        "$.limits.max_num_tokens",
        "$.kv_cache.host_cache_size",
    ]
