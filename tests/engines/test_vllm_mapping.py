"""forge/engines/vllm/mapping.py: every contract field becomes a stated vLLM engine argument (pure,
no vLLM)."""
from __future__ import annotations

import os

import pytest

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from forge.engines.vllm import mapping
from forge.errors import ConfigError


@pytest.fixture(scope="module")
def loaded():
    return load_node(PACKAGED_NODES["local-vllm"])


def _variant(contract, **changes):
    """The contract with some fields replaced (nested by dotted key), keeping its file and
    sections."""
    data = contract.model_dump()
    sections = dict(contract.sections)
    if "vllm" in changes:
        sections["vllm"] = changes.pop("vllm")
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    out = type(contract).model_validate({**data, "sections": sections})
    out._source = contract.source
    return out


def test_every_field_of_the_embedded_contract_is_mapped(loaded):
    c, plan = loaded.contracts["tiny-llama-vllm"], loaded.plans[0]
    args = mapping.engine_arguments(c, plan)
    model_dir = str(c.resolve("tiny-llama"))
    assert args == {
        "model": model_dir,
        "tokenizer": model_dir,
        "load_format": "auto",
        "dtype": "float32",
        "kv_cache_dtype": "auto",
        "seed": 0,
        "max_model_len": 512,
        "max_num_batched_tokens": 512,
        "max_num_seqs": 32,
        "block_size": 32,
        "kv_cache_memory_bytes": 16384 * 2 * 4 * 4 * 32 * 4,
        "num_gpu_blocks_override": 512,
        "gpu_memory_utilization": 0.037,
        "kv_offloading_size": None,
        "kv_offloading_backend": "native",
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": 0,
        "scheduler_reserve_full_isl": True,
        "async_scheduling": False,
        "scheduling_policy": "priority",
        "enforce_eager": True,
        "attention_backend": "CPU_ATTN",
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        "stream_interval": 1,
        "generation_config": "vllm",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "distributed_executor_backend": "uni",
        "disable_log_stats": False,
    }
    assert None not in [v for k, v in args.items() if k != "kv_offloading_size"]


def test_arguments_follow_the_contract(loaded):
    c, plan = loaded.contracts["tiny-llama-vllm"], loaded.plans[0]
    sec = c.sections["vllm"].model_copy(
        update={"chunked_prefill": False, "enforce_eager": False, "seed": 7}
    )
    gpu = _variant(
        c,
        **{
            "limits.max_num_tokens": 1024,
            "limits.max_batch_size": 8,
            "kv_cache.block_reuse": False,
            "kv_cache.tokens_per_block": 64,
            "precision.weights": "bf16",
            "precision.kv_cache": "fp8",
            "kv_cache.host_cache_size": "2GiB",
            "target.kind": "gpu",
            "target.compute_capability": "9.0",
            "artifact.random_weights": True,
        },
        vllm=sec.model_copy(update={"attention_backend": "FLASH_ATTN"}),
    )
    from forge.config.plan import plan_card

    gplan = plan_card(plan.card, gpu)
    args = mapping.engine_arguments(gpu, gplan)
    assert (args["max_num_batched_tokens"], args["max_num_seqs"], args["block_size"]) == (
        1024,
        8,
        64,
    )
    assert (args["dtype"], args["kv_cache_dtype"], args["load_format"]) == (
        "bfloat16",
        "fp8",
        "dummy",
    )
    assert (
        args["enable_prefix_caching"],
        args["enable_chunked_prefill"],
        args["enforce_eager"],
    ) == (False, False, False)
    assert (args["kv_offloading_size"], args["seed"], args["attention_backend"]) == (
        2.0,
        7,
        "FLASH_ATTN",
    )
    assert args["num_gpu_blocks_override"] == gplan.num_blocks == 16384 // 64
    assert args["kv_cache_memory_bytes"] == gplan.num_blocks * 64 * gplan.bytes_per_token


@pytest.mark.parametrize("changes, field, words", [
    ({"precision.weights": "fp8"}, "$.precision.weights", "quantized checkpoint"),
    ({"precision.kv_cache": "int8"}, "$.precision.kv_cache", "cannot be honoured"),
    ({"precision.weights": "bf16"}, "$.precision.kv_cache", "kv_cache fp32 with weights bf16"),
    ({"kv_cache.host_cache_size": "1GiB"}, "$.kv_cache.host_cache_size", "must be 0"),
])
def test_unmappable_contracts_are_refused_at_the_field(loaded, changes, field, words):
    c = _variant(loaded.contracts["tiny-llama-vllm"], **changes)
    with pytest.raises(ConfigError) as e:
        mapping.engine_arguments(c, loaded.plans[0])
    assert [p.path for p in e.value.problems] == [field]
    assert words in str(e.value)


@pytest.mark.parametrize("update, budget, field", [
    ({"async_scheduling": True}, 512, "$.vllm.async_scheduling"),
    ({"attention_backend": "FLASH_ATTN"}, 512, "$.vllm.attention_backend"),
    ({"chunked_prefill": False}, 511, "$.vllm.chunked_prefill"),
    ({"long_prefill_token_threshold": 513}, 512, "$.vllm.long_prefill_token_threshold"),
])
def test_switches_vllm_would_change_are_refused(loaded, update, budget, field):
    c = loaded.contracts["tiny-llama-vllm"]
    c2 = _variant(
        c, **{"limits.max_num_tokens": budget}, vllm=c.sections["vllm"].model_copy(update=update)
    )
    assert [p.path for p in mapping.problems(c2)] == [field]
    assert mapping.problems(_variant(c, **{"limits.max_num_tokens": budget})) == []


def test_a_contract_without_its_section_is_refused_naming_it(loaded):
    c = loaded.contracts["tiny-llama-vllm"]
    bare = type(c).model_validate({**c.model_dump(), "sections": {}})
    with pytest.raises(ConfigError) as e:
        mapping.engine_arguments(bare, loaded.plans[0])
    assert "$.vllm: backend vllm needs a vllm: section" in str(e.value)
    assert "enforce_eager" in str(e.value)


def test_environment_clears_the_cpu_kv_override():
    env = {"VLLM_CPU_KVCACHE_SPACE": "40", "OTHER": "x"}
    before = mapping.apply_environment(env)
    assert env == {
        "OTHER": "x",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CONFIGURE_LOGGING": "0",
    }
    assert before == {"VLLM_CPU_KVCACHE_SPACE": "40", "VLLM_ENABLE_V1_MULTIPROCESSING": None,
                      "VLLM_CONFIGURE_LOGGING": None}
    assert (
        "VLLM_CPU_KVCACHE_SPACE" in mapping.environment()
        and mapping.environment()["VLLM_CPU_KVCACHE_SPACE"] is None
    )
    assert os.environ is not env


def test_read_back_names_field_contract_value_and_engine_value(loaded):
    c, plan = loaded.contracts["tiny-llama-vllm"], loaded.plans[0]
    built = {
        "max_num_batched_tokens": 512,
        "max_num_seqs": 32,
        "max_model_len": 512,
        "block_size": 32,
        "num_gpu_blocks_override": 512,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "async_scheduling": False,
        "enforce_eager": True,
    }
    assert mapping.read_back_problems(c, plan, built) == []
    wrong = {**built, "block_size": 128, "max_num_seqs": 256}
    got = [p.render() for p in mapping.read_back_problems(c, plan, wrong)]
    where = mapping.where(c)
    assert got == [f"{where}::$.limits.max_batch_size: contract 32, vLLM built 256 "
                   "(scheduler_config.max_num_seqs); "
                   "the card is refused",
                   f"{where}::$.kv_cache.tokens_per_block: contract 32, vLLM built 128 "
                   "(cache_config.block_size); "
                   "the card is refused"]


@pytest.mark.parametrize("field", list(mapping.VllmSection.model_fields))
def test_a_contract_leaving_any_vllm_field_out_is_refused_naming_it(field, tmp_path, monkeypatch):
    import yaml

    from forge.config.load import load_paths
    from forge.embedded import HERE

    data = yaml.safe_load((HERE / "tiny-llama-vllm.yaml").read_text())
    data["artifact"]["checkpoint"] = str(HERE / "tiny-llama")
    del data["vllm"][field]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    assert [p.render() for p in load_paths(["c.yaml"]).problems] == [f"c.yaml::$.vllm.{field}: "
                                                                     "missing required key"]


def test_version_rules_refuse_what_each_vllm_release_refuses_at_load(loaded):
    """vLLM 0.33 refuses a bf16/fp16 KV cache whose dtype differs from the weights'
    (_reject_mismatched_float_kv_ cache); 0.34 a seed above 2**32 - 1. Read from vLLM's sources;
    scripts/check_vllm_wheel.py shows the releases."""
    from forge.engines.vllm import rules

    c = loaded.contracts["tiny-llama-vllm"]
    mixed = _variant(c, **{"precision.weights": "bf16", "precision.kv_cache": "fp16"})
    seeded = _variant(c, vllm={**c.sections["vllm"].model_dump(), "seed": 2**32})
    paths = lambda contract, version: [p.path for p in mapping.problems(contract, vllm_version=version)]  # noqa: E731
    assert paths(mixed, (0, 32)) == [] and paths(seeded, (0, 33)) == []
    assert paths(mixed, (0, 33)) == ["$.precision.kv_cache"] and paths(mixed, (0, 34)) == [
        "$.precision.kv_cache"
    ]
    assert paths(seeded, (0, 34)) == ["$.vllm.seed"]
    # not installed
    assert paths(mixed, None) == ["$.precision.kv_cache"] and paths(seeded, None) == ["$.vllm.seed"]
    (p,) = mapping.problems(seeded, vllm_version=(0, 34))
    assert p.message == "4294967296 is above 4294967295, which vLLM 0.34 refuses"
    # the same weights and KV, or fp8, stay allowed
    assert (
        paths(_variant(c, **{"precision.weights": "bf16", "precision.kv_cache": "bf16"}), (0, 34))
        == []
    )
    assert rules.SUPPORTED[-1] == (0, 34)


@pytest.mark.parametrize(
    "backend, compact",
    [("xgrammar", True), ("guidance", True), ("outlines", False), ("lm-format-enforcer", False)],
)
def test_compact_json_is_asked_only_of_the_backends_vllm_allows_it_with(loaded, backend, compact):
    """vLLM's StructuredOutputsConfig refuses disable_any_whitespace with outlines and
    lm-format-enforcer: forge sent it always, so those tiers could never load."""
    c = _variant(loaded.contracts["tiny-llama-vllm"],
                 vllm={**loaded.contracts["tiny-llama-vllm"].sections["vllm"].model_dump(),
                       "structured_outputs_backend": backend})
    args = mapping.engine_arguments(c, loaded.plans[0])
    assert args["structured_outputs_config"] == {
        "backend": backend,
        "disable_any_whitespace": compact,
    }


def test_a_vllm_refusal_is_placed_at_the_contract_field_it_names():
    from forge.engines.vllm.rules import field_of

    assert (
        field_of('kv_cache_dtype="float16" is incompatible with dtype="bfloat16"')
        == "$.precision.kv_cache"
    )
    assert (
        field_of("disable_any_whitespace is only supported for xgrammar and guidance backends.")
        == "$.vllm.structured_outputs_backend"
    )
    assert (
        field_of("User-specified max_model_len (4128) is greater than the derived max_model_len")
        == "$.limits.max_input_len"
    )
    assert field_of("something else entirely") == "$"
