"""What forge passes to TensorRT-LLM for a card (`engine_arguments`), row by row of what the engine
would otherwise decide itself, checked against the field lists recorded from TensorRT-LLM's sources.
Pure."""
from __future__ import annotations

import json
import re

import pytest

from forge.config.models import (
    Artifact,
    Card,
    Contract,
    KvCache,
    Limits,
    ModelGeometry,
    Precision,
    Target,
)
from forge.config.plan import plan_card
from forge.engines.trtllm import mapping as tm
from forge.engines.interface import EngineRequest, Sampling
from forge.engines.trtllm.arguments import cuda_graph_batch_sizes
from forge.engines.trtllm.release import Release, ships_executor, version_tuple
from forge.engines.trtllm.section import SECTION, TrtllmSection
from forge.errors import EngineUnavailable
from tests.engines.trtllm.recorded import main_release, recorded_fields, recorded_files

LLAMA7B = ModelGeometry(
    architecture="LlamaForCausalLM",
    num_layers=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=32000,
    weights_gib=7.2,
)
SWITCHES = TrtllmSection(prefix_aware_scheduling=True, overlap_scheduler=True, stream_interval=1)


def contract(*, artifact=None, kv=None, precision=("fp8", "fp8"), slots=256, section=SWITCHES):
    c = Contract(
        contract="llama7b-fp8-1k",
        backend="trtllm",
        model=LLAMA7B,
        artifact=artifact or Artifact(checkpoint="../models/llama7b-fp8", tokenizer="../tok"),
        precision=Precision(weights=precision[0], kv_cache=precision[1]),
        limits=Limits(
            max_batch_size=slots, max_num_tokens=8192, max_input_len=1024, max_output_len=128
        ),
        kv_cache=kv
        or KvCache(
            tokens_per_block=32, free_gpu_memory_fraction=0.85, host_cache_size=0, block_reuse=True
        ),
        target=Target(kind="gpu", compute_capability="9.0"),
        sections={SECTION: section} if section is not None else {},
    )
    return c


def args_for(c, release=None, **kw):
    card = Card(
        index=0,
        kind="gpu",
        model="NVIDIA H200",
        memory_gib=140.0,
        compute_capability="9.0",
        engine=c.contract,
    )
    return tm.engine_arguments(c, plan_card(card, c), release or main_release(), **kw)


# ----------------------------------------------------------------------------- the recorded field
# lists
def test_recorded_lists_name_the_file_and_commit_they_came_from():
    files = recorded_files()
    assert files, "no recorded field lists"
    for name, data in files.items():
        src = data["source"]
        assert src["repository"] == "NVIDIA/TensorRT-LLM" and src["file"].startswith(
            "tensorrt_llm/"
        ), name
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]), name
        assert src["commit"][:7] in name or src["commit"][:8] in name, (
            f"{name}: the file name carries the commit"
        )
        for cls, entry in data["classes"].items():
            assert entry["fields"] == sorted(set(entry["fields"])), (
                f"{name}: {cls} fields sorted and unique"
            )


def _passed_names(args: dict) -> dict[str, set[str]]:
    """class -> the fields forge passes to it, from an engine_arguments result on the LLM API path."""
    kw = args["kwargs"]
    return {
        "TorchLlmArgs": set(kw),
        "KvCacheConfig": set(kw["kv_cache_config"]),
        "SchedulerConfig": set(kw["scheduler_config"]),
        "CudaGraphConfig": set(kw["cuda_graph_config"]),
    }


def _sampling_names() -> set[str]:
    names = set()
    for sampling in (Sampling(), Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=7)):
        names |= set(tm.sampling_params_spec(8, sampling, None, eos_id=2, pad_id=0))
    return names | {"guided_decoding"}


def test_every_field_forge_passes_is_in_the_recorded_lists():
    """Fails when forge passes a name TensorRT-LLM's sources (as recorded) do not define."""
    fields = recorded_fields()
    args = args_for(
        contract(
            kv=KvCache(
                tokens_per_block=32, max_tokens=65536, host_cache_size="1GiB", block_reuse=True
            )
        )
    )
    missing = {
        cls: sorted(names - fields[cls])
        for cls, names in _passed_names(args).items()
        if names - fields[cls]
    }
    missing.update({"SamplingParams": sorted(_sampling_names() - fields["SamplingParams"])}
                   if _sampling_names() - fields["SamplingParams"] else {})
    assert missing == {}, f"forge passes fields the recorded TensorRT-LLM sources lack: {missing}"
    assert args["not_passed"] == {}          # main has every field forge states


def test_a_field_the_release_lacks_is_left_out_and_said_so():
    older = main_release(
        drop={"KvCacheConfig": {"use_kv_cache_manager_v2"}, "TorchLlmArgs": {"max_stats_len"}}
    )
    args = args_for(contract(), older)
    assert "use_kv_cache_manager_v2" not in args["kwargs"]["kv_cache_config"]
    assert "max_stats_len" not in args["kwargs"]
    assert set(args["not_passed"]) == {"kv_cache_config.use_kv_cache_manager_v2", "max_stats_len"}
    assert (
        "only the V1 KV-cache manager"
        in args["not_passed"]["kv_cache_config.use_kv_cache_manager_v2"]
    )
    for name, why in args["not_passed"].items():
        assert why.startswith("TensorRT-LLM main (recorded) has no "), why


# ----------------------------------------------------------------------------- one test per row of
# the audit
def test_engine_dirs_are_refused_on_a_release_without_the_executor():
    c = contract(artifact=Artifact(engine_dir="../engines/e", tokenizer="../tok"), section=None)
    with pytest.raises(EngineUnavailable) as err:
        args_for(c)
    msg = str(err.value)
    assert (
        "\n" not in msg
        and "::$.artifact.engine_dir: " in msg
        and "no Executor API" in msg
        and "1.2.x" in msg
    )
    legacy = Release("1.2.1", None, has_executor=True, per_request_seed=False)
    spec = args_for(c, legacy)
    assert (
        spec["api"].startswith("tensorrt_llm.bindings.executor.Executor")
        and spec["kwargs"]["max_queue_size"] == 256
    )
    assert (
        ships_executor("1.2.1")
        and ships_executor("1.2.0rc6.post3")
        and not ships_executor("1.3.0rc14")
    )
    assert version_tuple("1.3.0rc14") == (1, 3, 0) and version_tuple("junk") == ()


def test_kv_dtype_is_stated_fp8_explicitly_and_auto_only_for_the_model_dtype():
    assert args_for(contract())["kwargs"]["kv_cache_config"]["dtype"] == "fp8"
    bf16 = args_for(contract(precision=("bf16", "bf16")))["kwargs"]
    assert bf16["kv_cache_config"]["dtype"] == "auto" and bf16["dtype"] == "bfloat16"
    # 16-bit KV with fp8 weights: "auto" is passed only because validation refuses a checkpoint
    # declaring another KV dtype (tests/cases/invalid/trtllm-kv-quant and test_kv_quant_*)
    assert (
        args_for(contract(precision=("fp8", "bf16")))["kwargs"]["kv_cache_config"]["dtype"]
        == "auto"
    )


def _checkpoint(tmp_path, hf_quant=None, quantization_config=None):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"]}
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (ckpt / "config.json").write_text(json.dumps(cfg))
    if hf_quant is not None:
        (ckpt / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    c = contract(artifact=Artifact(checkpoint=str(ckpt)), precision=("fp8", "bf16"))
    return c


@pytest.mark.parametrize(
    "hf_quant, qc, refused",
    [
        (
            {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
            None,
            "hf_quant_config.json",
        ),
        (
            {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
            None,
            "hf_quant_config.json kv_cache_quant_algo",
        ),
        (
            None,
            {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"},
            "quantization_config.kv_cache_quant_algo",
        ),
        (
            None,
            {
                "quant_method": "compressed-tensors",
                "kv_cache_scheme": {"num_bits": 8, "type": "float"},
            },
            "kv_cache_scheme",
        ),
        ({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}, None, None),
        (None, {"quant_method": "fp8"}, None),
        (None, None, None),
    ],
)
def test_kv_quant_declared_by_the_checkpoint_must_be_the_contracts(tmp_path, hf_quant, qc, refused):
    c = _checkpoint(tmp_path, hf_quant, qc)
    problems = [p for p in tm.trtllm_refusals(c) if p.path == "$.precision.kv_cache"]
    if refused is None:
        assert problems == []
    else:
        [p] = problems
        assert "fp8" in p.message and "the contract says bf16" in p.message and refused in p.message


def test_kv_quant_fp8_contract_matches_an_fp8_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"kv_cache_quant_algo": "FP8"}})
    )
    assert [p for p in tm.trtllm_refusals(contract(artifact=Artifact(checkpoint=str(ckpt))))] == []
    (ckpt / "hf_quant_config.json").write_text(
        json.dumps({"quantization": {"kv_cache_quant_algo": "NVFP4"}})
    )
    [p] = tm.trtllm_refusals(contract(artifact=Artifact(checkpoint=str(ckpt))))
    assert "nvfp4" in p.message and "the contract says fp8" in p.message
    (ckpt / "hf_quant_config.json").write_text("{not json")
    [p] = tm.trtllm_refusals(contract(artifact=Artifact(checkpoint=str(ckpt))))
    assert p.path == "$.artifact.checkpoint" and "quantization config" in p.message


def test_kv_manager_is_pinned_to_v1_so_max_tokens_sizes_the_pool():
    kv = args_for(contract(kv=KvCache(tokens_per_block=64, max_tokens=65536, host_cache_size="1GiB",
                                      block_reuse=True)))["kwargs"]["kv_cache_config"]
    assert kv == {
        "tokens_per_block": 64,
        "dtype": "fp8",
        "enable_block_reuse": True,
        "max_tokens": 65536,
        "free_gpu_memory_fraction": tm.MAX_TOKENS_MEMORY_CAP,
        "host_cache_size": 2**30,
        "use_kv_cache_manager_v2": False,
    }


def test_fraction_is_passed_as_the_contract_states_it():
    kv = args_for(contract())["kwargs"]["kv_cache_config"]
    assert (kv["free_gpu_memory_fraction"], kv["max_tokens"]) == (0.85, None)


def test_stats_are_bounded_by_max_stats_len_and_enabled():
    kw = args_for(contract())["kwargs"]
    assert kw["max_stats_len"] == kw["iter_stats_max_iterations"] == tm.ITER_STATS_MAX_ITERATIONS
    assert kw["enable_iter_perf_stats"] is True


@pytest.mark.parametrize("slots, sizes", [(1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]),
                                          (256, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
                                          (96, [1, 2, 4, 8, 16, 32, 64, 96])])
def test_cuda_graph_batch_sizes_reach_the_contracts_slots(slots, sizes):
    assert cuda_graph_batch_sizes(slots) == sizes
    graphs = args_for(contract(slots=slots))["kwargs"]["cuda_graph_config"]
    assert graphs == {"batch_sizes": sizes, "max_batch_size": slots, "enable_padding": True}


@pytest.mark.parametrize("prefix, overlap, interval", [(True, True, 1), (False, False, 4)])
def test_scheduling_switches_come_from_the_contract(prefix, overlap, interval):
    section = TrtllmSection(
        prefix_aware_scheduling=prefix, overlap_scheduler=overlap, stream_interval=interval
    )
    kw = args_for(contract(section=section))["kwargs"]
    assert kw["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT",
                                      "enable_prefix_aware_scheduling": prefix}
    assert kw["disable_overlap_scheduler"] is (not overlap) and kw["stream_interval"] == interval


def test_switches_a_release_cannot_honour_are_refused_naming_the_field():
    off = TrtllmSection(prefix_aware_scheduling=False, overlap_scheduler=True, stream_interval=1)
    lacking = {"SchedulerConfig": {"enable_prefix_aware_scheduling"}}
    for version, section in (("1.3.0rc14", SWITCHES), ("1.3.0rc14", off), ("1.2.1", SWITCHES)):
        release = Release(
            version, main_release(drop=lacking).fields, has_executor=False, per_request_seed=False
        )
        with pytest.raises(
            EngineUnavailable,
            match=r"::\$\.trtllm\.prefix_aware_scheduling: "
            r"TensorRT-LLM .* has no "
            r"SchedulerConfig\.enable_prefix_aware_scheduling",
        ):
            args_for(contract(section=section), release)
    v121 = Release(
        "1.2.1", main_release(drop=lacking).fields, has_executor=True, per_request_seed=False
    )
    # 1.2.x has no prefix-aware scheduling: false is exact
    args = args_for(contract(section=off), v121)
    assert "enable_prefix_aware_scheduling" not in args["kwargs"]["scheduler_config"]
    assert (
        "never schedules prefix-aware"
        in args["not_passed"]["scheduler_config.enable_prefix_aware_scheduling"]
    )
    for model, field, path in (
        ("TorchLlmArgs", "stream_interval", "$.trtllm.stream_interval"),
        ("TorchLlmArgs", "disable_overlap_scheduler", "$.trtllm.overlap_scheduler"),
        ("CudaGraphConfig", "batch_sizes", "$.limits.max_batch_size"),
        ("KvCacheConfig", "dtype", "$.precision.kv_cache"),
        ("KvCacheConfig", "tokens_per_block", "$.kv_cache.tokens_per_block"),
    ):
        with pytest.raises(
            EngineUnavailable, match=re.escape(f"::{path}: ") + f".* has no {model}.{field}"
        ):
            args_for(contract(), main_release(drop={model: {field}}))


def test_a_checkpoint_contract_needs_its_section():
    [p] = tm.trtllm_refusals(contract(section=None))
    assert p.path == "$.trtllm" and "must state its trtllm: section" in p.message
    with pytest.raises(EngineUnavailable, match=r"::\$\.trtllm: "):
        args_for(contract(section=None))
    engine = contract(artifact=Artifact(engine_dir="../e", tokenizer="../tok"))
    assert [p.path for p in tm.trtllm_refusals(engine)] == ["$.trtllm"]


def test_a_per_request_seed_is_refused_where_the_release_ignores_it():
    c = contract()
    seeded = EngineRequest("r", (1,), 4, sampling=Sampling(temperature=0.8, seed=7))
    assert tm.request_refusal(c, seeded, frozenset(), seed_honoured=False) == tm.SEED_IGNORED
    assert "#17172" in tm.SEED_IGNORED
    assert tm.request_refusal(c, seeded, frozenset(), seed_honoured=True) is None
    # temperature 0: the seed draws nothing
    greedy = EngineRequest("r", (1,), 4, sampling=Sampling(seed=7))
    assert tm.request_refusal(c, greedy, frozenset(), seed_honoured=False) is None


def test_unchecked_release_passes_everything_and_states_no_omission():
    args = args_for(contract(), Release.unchecked())
    assert args["release"] == "not installed" and args["not_passed"] == {}
    assert args["kwargs"]["kv_cache_config"]["use_kv_cache_manager_v2"] is False
    assert json.loads(json.dumps(args)) == args  # plain data: printable by provision --dry-run


def test_release_fields_are_read_from_pydantic_models_and_dataclasses():
    import dataclasses

    import pydantic

    from forge.engines.trtllm.release import model_field_names, release_from_models

    class Kv(pydantic.BaseModel):
        dtype: str = "auto"
        tokens_per_block: int = 32

    @dataclasses.dataclass
    class Sp:
        max_tokens: int = 32
        seed: int | None = None
        _hidden: int = dataclasses.field(default=0, init=False)

    assert model_field_names(Kv) == {"dtype", "tokens_per_block"}
    assert model_field_names(Sp) == {"max_tokens", "seed"}
    r = release_from_models("1.2.1", {"KvCacheConfig": Kv, "SamplingParams": Sp}, has_executor=True,
                            per_request_seed=False)
    assert r.has("KvCacheConfig", "dtype") and not r.has("KvCacheConfig", "use_kv_cache_manager_v2")
    assert not r.has("TorchLlmArgs", "max_stats_len")  # a class the release lacks has no fields
    assert Release.unchecked().has("TorchLlmArgs", "anything")
