"""The trtllm backend's pure mapping (contract -> TensorRT-LLM settings), and its guards on a
machine without TensorRT-LLM. tests/engines/trtllm/test_trtllm_wiring.py drives the backend against
stand-in bindings."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from forge.config.models import Artifact, KvCache
from forge.config.plan import plan_card
from forge.engines.trtllm import mapping as tm
from forge.engines.interface import EngineRequest, Guide, Sampling
from forge.errors import ConfigError, EngineUnavailable
from tests.engines.trtllm.contracts import CKPT, STATS_154, contract, gpu_card as _card


# ----------------------------------------------------------------------------- engine_dir:
# ExecutorConfig
def test_executor_config_for_the_standard_fp8_tier():
    spec = tm.executor_config_spec(contract(), device_ordinal=1)
    assert spec["max_beam_width"] == 1 and spec["batching_type"] == "INFLIGHT"
    assert (spec["max_batch_size"], spec["max_num_tokens"]) == (256, 8192)
    assert spec["max_queue_size"] == 256  # bounded, never the unbounded default
    assert spec["enable_chunked_context"] is False
    assert spec["iter_stats_max_iterations"] == tm.ITER_STATS_MAX_ITERATIONS
    assert spec["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}
    assert spec["kv_cache_config"] == {"enable_block_reuse": True, "max_tokens": None,
                                       "free_gpu_memory_fraction": 0.85, "host_cache_size": 0,
                                       "onboard_blocks": True}
    assert spec["parallel_config"]["device_ids"] == [1]


def test_max_tokens_sizing_states_the_memory_cap_and_host_cache_is_bytes():
    kv = KvCache(
        tokens_per_block=128, max_tokens=200_000, host_cache_size="8GiB", block_reuse=False
    )
    spec = tm.executor_config_spec(contract(kv=kv), 0)["kv_cache_config"]
    assert spec["max_tokens"] == 200_000
    # the smaller of the two wins
    assert spec["free_gpu_memory_fraction"] == tm.MAX_TOKENS_MEMORY_CAP < 1.0
    assert spec["host_cache_size"] == 8 * 2**30
    assert spec["enable_block_reuse"] is False


def test_capacity_policy_is_a_parameter_and_checked():
    spec = tm.executor_config_spec(contract(), 0, capacity_scheduler_policy="MAX_UTILIZATION")
    assert spec["scheduler_config"]["capacity_scheduler_policy"] == "MAX_UTILIZATION"
    with pytest.raises(ValueError, match="GUARANTEED_NO_EVICT"):
        tm.executor_config_spec(contract(), 0, capacity_scheduler_policy="FIFO")


def test_kv_dtype_the_pytorch_path_cannot_store_is_refused():
    mixed = contract(artifact=CKPT, precision=("bf16", "fp16"))
    [p] = tm.contract_problems(mixed)
    assert p.path == "$.precision.kv_cache" and "fp16" in p.message


# ----------------------------------------------------------------------------- contract problems
def test_contract_problems_name_the_field():
    assert tm.contract_problems(contract()) == []
    full = contract(kv=KvCache(tokens_per_block=32, free_gpu_memory_fraction=1.0, host_cache_size=0,
                               block_reuse=True))
    [p] = tm.contract_problems(full)
    assert p.render().startswith("<contract llama7b-fp8-1k>::$.kv_cache.free_gpu_memory_fraction: ")
    no_tok = contract(artifact=Artifact(engine_dir="../e"))
    assert [p.path for p in tm.contract_problems(no_tok)] == ["$.artifact.tokenizer"]
    cpu = contract(target=None)
    assert [p.path for p in tm.contract_problems(cpu)] == ["$.target.kind"]


# ----------------------------------------------------------------------------- requests, sampling,
# guides
def test_greedy_is_top_k_1_and_sampling_fields_pass_through():
    assert tm.sampling_config_spec(Sampling()) == {"top_k": 1}
    assert tm.sampling_config_spec(Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=7)) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7}
    assert tm.sampling_config_spec(Sampling(temperature=1.0)) == {"temperature": 1.0, "top_p": 1.0}


def test_sampling_params_always_set_max_tokens():
    spec = tm.sampling_params_spec(5, Sampling(), None, eos_id=2, pad_id=0)
    assert spec["max_tokens"] == 5  # SamplingParams.max_tokens defaults to 32
    assert (spec["end_id"], spec["pad_id"], spec["ignore_eos"], spec["detokenize"]) == (
        2,
        0,
        False,
        False,
    )
    assert tm.sampling_params_spec(5, Sampling(stop_at_eos=False), None, 2, 0)["ignore_eos"] is True


def test_executor_request_streams_and_excludes_the_prompt():
    spec = tm.executor_request_spec(
        (1, 5, 9), 16, Sampling(stop_at_eos=False), None, eos_id=2, pad_id=0
    )
    assert spec["input_token_ids"] == [1, 5, 9] and spec["max_tokens"] == 16
    assert spec["streaming"] is True and spec["output_config"] == {
        "exclude_input_from_output": True
    }
    assert spec["end_id"] == -1  # EOS disabled, as the LLM API does for ignore_eos
    assert spec["guided_decoding_params"] is None


def test_choice_becomes_an_escaped_alternation():
    rx = tm.guide_regex(Guide(choice=("yes", "no", "a.b", "(x)|y", "1+1=2?", "line\nbreak")))
    assert rx == r"(yes|no|a\.b|\(x\)\|y|1\+1=2\?|line\nbreak)"
    for choice in ("yes", "no", "a.b", "(x)|y", "1+1=2?", "line\nbreak"):
        assert re.fullmatch(rx, choice)
    assert not re.fullmatch(rx, "axb") and not re.fullmatch(rx, "yesno")
    assert tm.executor_guide_spec(Guide(choice=("a", "b"))) == {
        "guide_type": "REGEX",
        "guide": "(a|b)",
    }


def test_json_schema_and_regex_guides():
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["pos", "neg"]}},
        "required": ["label"],
    }
    assert tm.executor_guide_spec(Guide(json_schema=schema)) == {"guide_type": "JSON_SCHEMA",
                                                                 "guide": json.dumps(schema)}
    assert tm.sampling_params_spec(4, Sampling(), Guide(json_schema=schema), 2, 0)[
        "guided_decoding"
    ] == {"json": schema}
    assert tm.sampling_params_spec(4, Sampling(), Guide(regex="[0-9]+"), 2, 0)[
        "guided_decoding"
    ] == {"regex": "[0-9]+"}


def test_guided_decoding_config_lists_the_vocab_in_id_order():
    spec = tm.guided_decoding_config_spec({"b": 1, "a": 0, "c": 2}, "{}", eos_id=2)
    assert spec == {"backend": "XGRAMMAR", "encoded_vocab": ["a", "b", "c"], "tokenizer_str": "{}",
                    "stop_token_ids": [2]}


def test_request_refusals():
    c = contract()
    ok = EngineRequest("r", (1,) * 1024, 128)
    assert tm.request_refusal(c, ok, frozenset()) is None
    assert "exceeds" in tm.request_refusal(c, EngineRequest("r", (1,) * 1025, 1), frozenset())
    assert "exceeds" in tm.request_refusal(c, EngineRequest("r", (1,), 129), frozenset())
    assert "hidden" in tm.request_refusal(
        c, EngineRequest("r", (1,), 1, want_hidden=True), frozenset()
    )
    guided = EngineRequest("r", (1,), 1, guide=Guide(choice=("a",)))
    assert "choice" in tm.request_refusal(c, guided, frozenset())
    assert tm.request_refusal(c, guided, frozenset({"choice"})) is None


# ----------------------------------------------------------------------------- results and stats
def test_finish_reasons():
    assert tm.finish_reason_from_executor("END_ID") == ("eos", None)
    assert tm.finish_reason_from_executor("LENGTH") == ("length", None)
    assert tm.finish_reason_from_executor("STOP_WORDS") == ("stop", None)
    assert tm.finish_reason_from_executor("CANCELLED") == ("cancelled", None)
    assert tm.finish_reason_from_executor("TIMED_OUT")[0] == "error"
    assert tm.finish_reason_from_executor("NOT_FINISHED")[0] == "error"
    assert tm.finish_reason_from_llmapi("stop") == ("eos", None)
    assert tm.finish_reason_from_llmapi("length") == ("length", None)
    assert tm.finish_reason_from_llmapi("cancelled") == ("cancelled", None)
    assert (
        tm.finish_reason_from_llmapi("timeout")[0] == "error"
        and tm.finish_reason_from_llmapi(None)[0] == "error"
    )


def test_iteration_stats_from_a_realistic_sample():
    s = tm.iteration_stats_from_json(json.dumps(STATS_154))
    assert (s.active, s.queued, s.kv_blocks_used, s.kv_blocks_free) == (1, 3, 3, 101253)
    assert s.tokens_last_step == 0 + 1  # numCtxTokens + one token per generation request
    assert s.steps == 155 and s.prefix_hit_tokens == 4 * 32


def test_latest_stats_picks_the_newest_and_tolerates_missing_sections():
    prefill = dict(
        STATS_154, iter=155, inflightBatchingStats={"numCtxTokens": 900, "numGenRequests": 7}
    )
    assert tm.latest_iteration_stats([STATS_154, json.dumps(prefill)]).tokens_last_step == 907
    assert tm.latest_iteration_stats([]) is None
    bare = tm.iteration_stats_from_json({"iter": 0, "numActiveRequests": 2, "kvCacheStats": None})
    assert (bare.active, bare.kv_blocks_used, bare.tokens_last_step, bare.steps) == (2, 0, 0, 1)
    idle = tm.idle_stats(tm.iteration_stats_from_json(STATS_154))
    assert (idle.active, idle.queued, idle.tokens_last_step, idle.kv_blocks_used, idle.steps) == (
        0,
        0,
        0,
        3,
        155,
    )


def test_cuda_device_ordinal():
    assert tm.cuda_device_ordinal(3, None) == 3
    assert tm.cuda_device_ordinal(3, "2,3") == 1
    with pytest.raises(ValueError, match="hidden by CUDA_VISIBLE_DEVICES"):
        tm.cuda_device_ordinal(0, "1")
    with pytest.raises(ValueError):
        tm.cuda_device_ordinal(0, "")


# ----------------------------------------------------------------------------- guards on this
# machine
def test_backend_module_imports_no_engine_library():
    code = ("import sys, forge.engines.trtllm.backend as b; "
            "print(sorted(m for m in ('tensorrt_llm', 'torch', 'transformers') if m in "
            "sys.modules))")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_backend_is_registered_as_trtllm():
    from forge import backends
    from forge.engines.trtllm import backend as trtllm_backend
    b = backends.get("trtllm")
    assert (b.factory, b.section, b.rules) == (
        trtllm_backend.create_engine,
        trtllm_backend.TrtllmSection,
        (trtllm_backend.trtllm_contract_rule,),
    )
    assert b.engine_arguments is trtllm_backend.planned_engine_arguments


def test_factory_without_tensorrt_llm_raises_engine_unavailable(monkeypatch):
    from forge.engines.trtllm import backend as trtllm_backend
    # import fails as on any machine without it
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    c = contract()
    with pytest.raises(EngineUnavailable) as err:
        trtllm_backend.create_engine(c, plan_card(_card(), c))
    msg = str(err.value)
    assert (
        "\n" not in msg
        and "pip install tensorrt-llm" in msg
        and "NVIDIA GPU" in msg
        and "1.2.x" in msg
    )


def test_validation_rule_reports_trtllm_refusals():
    from forge.config.load import LoadedSet
    from forge.config.registry import from_plugins
    from forge.engines.trtllm import backend as trtllm_backend
    assert trtllm_backend.trtllm_contract_rule in from_plugins().rules
    full = contract(kv=KvCache(tokens_per_block=32, free_gpu_memory_fraction=1.0, host_cache_size=0,
                               block_reuse=True))
    loaded = LoadedSet(contracts={"bad": full, "good": contract()})
    [p] = trtllm_backend.trtllm_contract_rule(loaded)
    assert p.path == "$.kv_cache.free_gpu_memory_fraction"


def test_factory_refuses_contract_problems_before_importing(monkeypatch):
    from forge.engines.trtllm import backend as trtllm_backend

    c = contract(
        kv=KvCache(
            tokens_per_block=32, free_gpu_memory_fraction=1.0, host_cache_size=0, block_reuse=True
        )
    )
    with pytest.raises(ConfigError, match=r"free_gpu_memory_fraction"):
        trtllm_backend.create_engine(c, plan_card(_card(), c))
