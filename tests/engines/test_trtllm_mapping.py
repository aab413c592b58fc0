"""The trtllm backend's pure mapping (contract -> TensorRT-LLM settings), and its guards on a machine without
TensorRT-LLM. The last section drives the backend against stand-in bindings whose keyword names are copied
from TensorRT-LLM's binding sources: it proves the wiring, not TensorRT-LLM's behaviour (never run here)."""
from __future__ import annotations

import datetime
import enum
import json
import re
import subprocess
import sys
import types

import pytest

from forge.config.models import Artifact, Card, Contract, KvCache, Limits, ModelGeometry, Precision, Target
from forge.config.plan import plan_card
from forge.engines import trtllm_mapping as tm
from forge.engines.interface import REFUSED, EngineBusy, EngineRequest, Guide, Sampling
from forge.engines.trtllm_section import SECTION, TrtllmSection
from forge.errors import ConfigError, EngineUnavailable
from tests.engines.trtllm_recorded import recorded_fields

LLAMA7B = ModelGeometry(architecture="LlamaForCausalLM", num_layers=32, num_kv_heads=8, head_dim=128,
                        vocab_size=32000, weights_gib=7.2)


SWITCHES = TrtllmSection(prefix_aware_scheduling=True, overlap_scheduler=False, stream_interval=2)


def contract(*, artifact=None, kv=None, precision=("fp8", "fp8"), limits=(256, 8192, 1024, 128), target="12.0"):
    artifact = artifact or Artifact(engine_dir="../engines/llama7b-fp8-1k", tokenizer="../engines/tok")
    return Contract(
        contract="llama7b-fp8-1k", backend="trtllm", model=LLAMA7B,
        artifact=artifact, sections={SECTION: SWITCHES} if artifact.checkpoint is not None else {},
        precision=Precision(weights=precision[0], kv_cache=precision[1]),
        limits=Limits(max_batch_size=limits[0], max_num_tokens=limits[1], max_input_len=limits[2],
                      max_output_len=limits[3]),
        kv_cache=kv or KvCache(tokens_per_block=32, free_gpu_memory_fraction=0.85, host_cache_size=0,
                               block_reuse=True),
        target=Target(kind="gpu", compute_capability=target) if target else Target(kind="cpu"))


CKPT = Artifact(checkpoint="../models/llama7b-fp8")


# ----------------------------------------------------------------------------- engine_dir: ExecutorConfig
def test_executor_config_for_the_standard_fp8_tier():
    spec = tm.executor_config_spec(contract(), device_ordinal=1)
    assert spec["max_beam_width"] == 1 and spec["batching_type"] == "INFLIGHT"
    assert (spec["max_batch_size"], spec["max_num_tokens"]) == (256, 8192)
    assert spec["max_queue_size"] == 256                          # bounded, never the unbounded default
    assert spec["enable_chunked_context"] is False
    assert spec["iter_stats_max_iterations"] == tm.ITER_STATS_MAX_ITERATIONS
    assert spec["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}
    assert spec["kv_cache_config"] == {"enable_block_reuse": True, "max_tokens": None,
                                       "free_gpu_memory_fraction": 0.85, "host_cache_size": 0,
                                       "onboard_blocks": True}
    assert spec["parallel_config"]["device_ids"] == [1]


def test_max_tokens_sizing_states_the_memory_cap_and_host_cache_is_bytes():
    kv = KvCache(tokens_per_block=128, max_tokens=200_000, host_cache_size="8GiB", block_reuse=False)
    spec = tm.executor_config_spec(contract(kv=kv), 0)["kv_cache_config"]
    assert spec["max_tokens"] == 200_000
    assert spec["free_gpu_memory_fraction"] == tm.MAX_TOKENS_MEMORY_CAP < 1.0   # the smaller of the two wins
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


# ----------------------------------------------------------------------------- requests, sampling, guides
def test_greedy_is_top_k_1_and_sampling_fields_pass_through():
    assert tm.sampling_config_spec(Sampling()) == {"top_k": 1}
    assert tm.sampling_config_spec(Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=7)) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7}
    assert tm.sampling_config_spec(Sampling(temperature=1.0)) == {"temperature": 1.0, "top_p": 1.0}


def test_sampling_params_always_set_max_tokens():
    spec = tm.sampling_params_spec(5, Sampling(), None, eos_id=2, pad_id=0)
    assert spec["max_tokens"] == 5                     # SamplingParams.max_tokens defaults to 32
    assert (spec["end_id"], spec["pad_id"], spec["ignore_eos"], spec["detokenize"]) == (2, 0, False, False)
    assert tm.sampling_params_spec(5, Sampling(stop_at_eos=False), None, 2, 0)["ignore_eos"] is True


def test_executor_request_streams_and_excludes_the_prompt():
    spec = tm.executor_request_spec((1, 5, 9), 16, Sampling(stop_at_eos=False), None, eos_id=2, pad_id=0)
    assert spec["input_token_ids"] == [1, 5, 9] and spec["max_tokens"] == 16
    assert spec["streaming"] is True and spec["output_config"] == {"exclude_input_from_output": True}
    assert spec["end_id"] == -1                        # EOS disabled, as the LLM API does for ignore_eos
    assert spec["guided_decoding_params"] is None


def test_choice_becomes_an_escaped_alternation():
    rx = tm.guide_regex(Guide(choice=("yes", "no", "a.b", "(x)|y", "1+1=2?", "line\nbreak")))
    assert rx == r"(yes|no|a\.b|\(x\)\|y|1\+1=2\?|line\nbreak)"
    for choice in ("yes", "no", "a.b", "(x)|y", "1+1=2?", "line\nbreak"):
        assert re.fullmatch(rx, choice)
    assert not re.fullmatch(rx, "axb") and not re.fullmatch(rx, "yesno")
    assert tm.executor_guide_spec(Guide(choice=("a", "b"))) == {"guide_type": "REGEX", "guide": "(a|b)"}


def test_json_schema_and_regex_guides():
    schema = {"type": "object", "properties": {"label": {"enum": ["pos", "neg"]}}, "required": ["label"]}
    assert tm.executor_guide_spec(Guide(json_schema=schema)) == {"guide_type": "JSON_SCHEMA",
                                                                 "guide": json.dumps(schema)}
    assert tm.sampling_params_spec(4, Sampling(), Guide(json_schema=schema), 2, 0)["guided_decoding"] == {
        "json": schema}
    assert tm.sampling_params_spec(4, Sampling(), Guide(regex="[0-9]+"), 2, 0)["guided_decoding"] == {
        "regex": "[0-9]+"}


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
    assert "hidden" in tm.request_refusal(c, EngineRequest("r", (1,), 1, want_hidden=True), frozenset())
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
    assert tm.finish_reason_from_llmapi("timeout")[0] == "error" and tm.finish_reason_from_llmapi(None)[0] == "error"


# The /metrics example of docs/source/commands/trtllm-serve (iter 154, its kvCacheStats), completed with
# the remaining keys IterationStats serializes to (cpp/tensorrt_llm/executor/jsonSerialization.cpp).
STATS_154 = {
    "timestamp": "12-03-2025 10:11:12", "iter": 154, "iterLatencyMS": 7.00688362121582,
    "newActiveRequestsQueueLatencyMS": 0.0007503032684326172, "numNewActiveRequests": 0,
    "numActiveRequests": 1, "numQueuedRequests": 3, "numCompletedRequests": 0, "maxNumActiveRequests": 2048,
    "maxBatchSizeStatic": 2048, "maxBatchSizeTunerRecommended": 0, "maxBatchSizeRuntime": 2048,
    "maxNumTokensStatic": 8192, "maxNumTokensTunerRecommended": 0, "maxNumTokensRuntime": 8192,
    "gpuMemUsage": 76665782272, "cpuMemUsage": 0, "pinnedMemUsage": 0,
    "kvCacheStats": {"allocNewBlocks": 3126, "allocTotalBlocks": 3126, "cacheHitRate": 0.00128,
                     "freeNumBlocks": 101253, "maxNumBlocks": 101256, "missedBlocks": 3121, "reusedBlocks": 4,
                     "tokensPerBlock": 32, "usedNumBlocks": 3},
    "staticBatchingStats": None,
    "inflightBatchingStats": {"numScheduledRequests": 1, "numContextRequests": 0, "numGenRequests": 1,
                              "numPausedRequests": 0, "numCtxTokens": 0, "microBatchId": 0,
                              "avgNumDecodedTokensPerIter": 1.0},
    "specDecodingStats": None,
}


def test_iteration_stats_from_a_realistic_sample():
    s = tm.iteration_stats_from_json(json.dumps(STATS_154))
    assert (s.active, s.queued, s.kv_blocks_used, s.kv_blocks_free) == (1, 3, 3, 101253)
    assert s.tokens_last_step == 0 + 1                 # numCtxTokens + one token per generation request
    assert s.steps == 155 and s.prefix_hit_tokens == 4 * 32


def test_latest_stats_picks_the_newest_and_tolerates_missing_sections():
    prefill = dict(STATS_154, iter=155, inflightBatchingStats={"numCtxTokens": 900, "numGenRequests": 7})
    assert tm.latest_iteration_stats([STATS_154, json.dumps(prefill)]).tokens_last_step == 907
    assert tm.latest_iteration_stats([]) is None
    bare = tm.iteration_stats_from_json({"iter": 0, "numActiveRequests": 2, "kvCacheStats": None})
    assert (bare.active, bare.kv_blocks_used, bare.tokens_last_step, bare.steps) == (2, 0, 0, 1)
    idle = tm.idle_stats(tm.iteration_stats_from_json(STATS_154))
    assert (idle.active, idle.queued, idle.tokens_last_step, idle.kv_blocks_used, idle.steps) == (0, 0, 0, 3, 155)


def test_cuda_device_ordinal():
    assert tm.cuda_device_ordinal(3, None) == 3
    assert tm.cuda_device_ordinal(3, "2,3") == 1
    with pytest.raises(ValueError, match="hidden by CUDA_VISIBLE_DEVICES"):
        tm.cuda_device_ordinal(0, "1")
    with pytest.raises(ValueError):
        tm.cuda_device_ordinal(0, "")


# ----------------------------------------------------------------------------- guards on this machine
def test_backend_module_imports_no_engine_library():
    code = ("import sys, forge.engines.trtllm_backend as b; "
            "print(sorted(m for m in ('tensorrt_llm', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_backend_is_registered_as_trtllm():
    from forge import backends
    from forge.engines import trtllm_backend
    b = backends.get("trtllm")
    assert (b.factory, b.section, b.rules) == (trtllm_backend.create_engine, trtllm_backend.TrtllmSection,
                                               (trtllm_backend.trtllm_contract_rule,))
    assert b.engine_arguments is trtllm_backend.planned_engine_arguments


def test_factory_without_tensorrt_llm_raises_engine_unavailable(monkeypatch):
    from forge.engines import trtllm_backend
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)   # import fails as on any machine without it
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    c = contract()
    with pytest.raises(EngineUnavailable) as err:
        trtllm_backend.create_engine(c, plan_card(_card(), c))
    msg = str(err.value)
    assert "\n" not in msg and "pip install tensorrt-llm" in msg and "NVIDIA GPU" in msg and "1.2.x" in msg


def test_validation_rule_reports_trtllm_refusals():
    from forge.config.load import LoadedSet
    from forge.config.registry import from_plugins
    from forge.engines import trtllm_backend
    assert trtllm_backend.trtllm_contract_rule in from_plugins().rules
    full = contract(kv=KvCache(tokens_per_block=32, free_gpu_memory_fraction=1.0, host_cache_size=0,
                               block_reuse=True))
    loaded = LoadedSet(contracts={"bad": full, "good": contract()})
    [p] = trtllm_backend.trtllm_contract_rule(loaded)
    assert p.path == "$.kv_cache.free_gpu_memory_fraction"


def test_factory_refuses_contract_problems_before_importing(monkeypatch):
    from forge.engines import trtllm_backend
    c = contract(kv=KvCache(tokens_per_block=32, free_gpu_memory_fraction=1.0, host_cache_size=0, block_reuse=True))
    with pytest.raises(ConfigError, match=r"free_gpu_memory_fraction"):
        trtllm_backend.create_engine(c, plan_card(_card(), c))


def _card(index=0):
    return Card(index=index, kind="gpu", model="NVIDIA GeForce RTX 5090", memory_gib=32.0, compute_capability="12.0",
                engine="llama7b-fp8-1k")


# ----------------------------------------------------------------------------- wiring against stand-in bindings
# Keyword names below are copied from cpp/tensorrt_llm/nanobind/executor/{executorConfig,request,executor}.cpp
# (the pybind versions take the same names). A stand-in accepts exactly those names and nothing else.
_NAMES = {
    "ExecutorConfig": "max_beam_width scheduler_config kv_cache_config enable_chunked_context normalize_log_probs "
                      "iter_stats_max_iterations request_stats_max_iterations batching_type max_batch_size "
                      "max_num_tokens parallel_config peft_cache_config logits_post_processor_config decoding_config "
                      "use_gpu_direct_storage gpu_weights_percent max_queue_size extended_runtime_perf_knob_config "
                      "debug_config recv_poll_period_ms max_seq_idle_microseconds spec_dec_config "
                      "guided_decoding_config additional_model_outputs cache_transceiver_config "
                      "gather_generation_logits mm_embedding_offloading enable_trt_overlap",
    "KvCacheConfig": "enable_block_reuse max_tokens max_attention_window sink_token_length free_gpu_memory_fraction "
                     "host_cache_size onboard_blocks cross_kv_cache_fraction secondary_offload_min_priority "
                     "event_buffer_max_size enable_partial_reuse copy_on_partial_reuse use_uvm runtime_defaults",
    "SchedulerConfig": "capacity_scheduler_policy context_chunking_policy dynamic_batch_config",
    "ParallelConfig": "communication_type communication_mode device_ids participant_ids orchestrator_config num_nodes",
    "GuidedDecodingConfig": "backend encoded_vocab tokenizer_str stop_token_ids",
    "SamplingConfig": "top_k top_p top_p_min top_p_reset_ids top_p_decay seed temperature min_tokens "
                      "beam_search_diversity_rate repetition_penalty presence_penalty frequency_penalty "
                      "length_penalty early_stopping no_repeat_ngram_size num_return_sequences min_p beam_width_array",
    "OutputConfig": "return_log_probs return_context_logits return_generation_logits exclude_input_from_output "
                    "return_encoder_output return_perf_metrics additional_model_outputs",
    "Request": "streaming sampling_config output_config end_id pad_id position_ids bad_words stop_words "
               "embedding_bias external_draft_tokens_config prompt_tuning_config multimodal_input "
               "multimodal_embedding mrope_config lora_config lookahead_config kv_cache_retention_config "
               "logits_post_processor_name logits_post_processor encoder_input_token_ids client_id "
               "return_all_generated_tokens priority type context_phase_params encoder_input_features "
               "encoder_output_length cross_attention_mask num_return_sequences eagle_config "
               "skip_cross_attn_blocks guided_decoding_params language_adapter_uid allotted_time_ms",
}
_POSITIONAL = {"SamplingConfig": 1, "Request": 2, "GuidedDecodingParams": 2}


def _standin(name):
    allowed = set(_NAMES.get(name, "").split())

    def __init__(self, *args, **kwargs):
        assert len(args) <= _POSITIONAL.get(name, 0), f"{name}: too many positional arguments"
        unknown = set(kwargs) - allowed
        assert not unknown, f"{name}() has no keyword {sorted(unknown)}"
        self.args, self.kwargs = args, kwargs
    return type(name, (), {"__init__": __init__})


class _FakeExecutor:
    """Records calls; answers await_responses from a script of (executor id, tokens, finish reason or None)."""

    def __init__(self, model_path, model_type, executor_config):
        self.config, self.enqueued, self.cancelled, self.timeouts, self.script = executor_config, [], [], [], []
        self.closed = False

    def enqueue_request(self, request):
        self.enqueued.append(request)
        return 100 + len(self.enqueued)

    def await_responses(self, timeout):
        assert isinstance(timeout, datetime.timedelta)
        self.timeouts.append(timeout)
        out, self.script = self.script, []
        return out

    def cancel_request(self, eid):
        self.cancelled.append(eid)

    def get_latest_iteration_stats(self):
        return [types.SimpleNamespace(to_json_str=lambda: json.dumps(STATS_154))]

    def shutdown(self):
        self.closed = True


def _response(eid, tokens, finish=None, error=None):
    result = types.SimpleNamespace(output_token_ids=[tokens], is_final=finish is not None,
                                   finish_reasons=[types.SimpleNamespace(name=finish)] if finish else [])
    return types.SimpleNamespace(request_id=eid, result=result, error_msg=error, has_error=lambda: error is not None)


@pytest.fixture
def fake_trtllm(monkeypatch):
    ex = types.ModuleType("tensorrt_llm.bindings.executor")
    for name in ("ExecutorConfig", "KvCacheConfig", "SchedulerConfig", "ParallelConfig", "SamplingConfig",
                 "OutputConfig", "Request"):
        setattr(ex, name, _standin(name))
    ex.GuidedDecodingConfig = _standin("GuidedDecodingConfig")
    ex.GuidedDecodingConfig.GuidedDecodingBackend = enum.Enum("GuidedDecodingBackend", "XGRAMMAR LLGUIDANCE")
    ex.GuidedDecodingParams = _standin("GuidedDecodingParams")
    ex.GuidedDecodingParams.GuideType = enum.Enum("GuideType", "JSON JSON_SCHEMA REGEX EBNF_GRAMMAR STRUCTURAL_TAG")
    ex.BatchingType = enum.Enum("BatchingType", "STATIC INFLIGHT")
    ex.CapacitySchedulerPolicy = enum.Enum("CapacitySchedulerPolicy", "MAX_UTILIZATION GUARANTEED_NO_EVICT STATIC_BATCH")
    ex.CommunicationType = enum.Enum("CommunicationType", "MPI")
    ex.CommunicationMode = enum.Enum("CommunicationMode", "LEADER ORCHESTRATOR")
    ex.ModelType = enum.Enum("ModelType", "DECODER_ONLY ENCODER_ONLY ENCODER_DECODER")
    ex.Executor = _FakeExecutor
    root, bindings = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.bindings")
    root.__version__, root.bindings, bindings.executor = "1.2.1", bindings, ex
    for name, mod in (("tensorrt_llm", root), ("tensorrt_llm.bindings", bindings),
                      ("tensorrt_llm.bindings.executor", ex)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    from forge.engines import trtllm_backend
    tokenizer = types.SimpleNamespace(eos_token_id=2, pad_token_id=0, get_vocab=lambda: {"<pad>": 0, "a": 1, "</s>": 2},
                                      backend_tokenizer=types.SimpleNamespace(to_str=lambda: '{"model": {}}'))
    monkeypatch.setattr(trtllm_backend, "_load_tokenizer", lambda c: tokenizer)
    return ex


def test_executor_engine_wiring(fake_trtllm):
    from forge.engines import trtllm_backend
    c = contract(limits=(2, 8192, 1024, 128))
    engine = trtllm_backend.create_engine(c, plan_card(_card(index=3), c))
    fake = engine._executor
    cfg = fake.config.kwargs
    assert cfg["max_queue_size"] == 2 and cfg["batching_type"] is fake_trtllm.BatchingType.INFLIGHT
    assert cfg["kv_cache_config"].kwargs["free_gpu_memory_fraction"] == 0.85
    assert cfg["scheduler_config"].kwargs["capacity_scheduler_policy"].name == "GUARANTEED_NO_EVICT"
    assert cfg["parallel_config"].kwargs["device_ids"] == [1]          # card 3 under CUDA_VISIBLE_DEVICES=2,3
    assert cfg["guided_decoding_config"].kwargs["encoded_vocab"] == ["<pad>", "a", "</s>"]
    assert engine.supports_guides == frozenset({"choice", "json_schema", "regex"})

    engine.submit([EngineRequest("a", (1, 5), 8), EngineRequest("b", (1,), 8, guide=Guide(choice=("x", "y")))])
    req_a, req_b = fake.enqueued
    assert req_a.args == ([1, 5], 8) and req_a.kwargs["end_id"] == 2 and req_a.kwargs["streaming"] is True
    assert req_a.kwargs["sampling_config"].kwargs == {"top_k": 1}
    assert req_b.kwargs["guided_decoding_params"].args[1] == "(x|y)"
    with pytest.raises(EngineBusy):
        engine.submit([EngineRequest("c", (1,), 8)])                   # 2 slots, both taken

    fake.script = [_response(101, [7]), _response(102, [9])]
    p = engine.poll(0.05)
    assert p.new_tokens == 2 and p.results == [] and fake.timeouts[-1] == datetime.timedelta(seconds=0.05)
    engine.cancel("b")
    assert fake.cancelled == [102]
    fake.script = [_response(101, [8, 2], "END_ID"), _response(102, [], "CANCELLED")]
    p = engine.poll(0.05)
    assert [(r.request_id, r.output_ids, r.finish_reason) for r in p.results] == [
        ("a", [7, 8, 2], "eos"), ("b", [9], "cancelled")]

    engine.submit([EngineRequest("d", (1,) * 2000, 8)])                # longer than max_input_len: failed here
    (refused,) = engine.poll(0.0).results
    assert refused.request_id == "d" and refused.finish_reason == REFUSED and len(fake.enqueued) == 2

    stats = engine.stats()
    assert (stats.active, stats.queued, stats.steps) == (1, 3, 155)
    engine.shutdown(5.0)
    assert fake.closed



def test_a_request_the_executor_rejects_is_a_typed_refusal(fake_trtllm):
    """Refused, not failed: the node answers it as the caller's to fix (RequestRejected, HTTP 400)."""
    from forge.engines import trtllm_backend
    c = contract(limits=(2, 8192, 1024, 128))
    engine = trtllm_backend.create_engine(c, plan_card(_card(index=3), c))

    def reject(request):
        raise ValueError("invalid sampling config")

    engine._executor.enqueue_request = reject
    engine.submit([EngineRequest("x", (1, 1), 8)])
    (res,) = engine.poll(0.0).results
    assert res.finish_reason == REFUSED and res.error == "TensorRT-LLM: invalid sampling config"
    engine.shutdown(5.0)

# The LLM API stand-ins accept exactly the fields recorded from TensorRT-LLM's sources (tests/engines/
# trtllm_fields/); GuidedDecodingParams' fields are from tensorrt_llm/sampling_params.py (1.0.0rc4).
_RECORDED = recorded_fields()
_LLMAPI_NAMES = {
    "LLM": _RECORDED["TorchLlmArgs"],
    "TorchLlmArgs": _RECORDED["TorchLlmArgs"],
    "KvCacheConfig": _RECORDED["KvCacheConfig"],
    "SchedulerConfig": _RECORDED["SchedulerConfig"],
    "CudaGraphConfig": _RECORDED["CudaGraphConfig"],
    "SamplingParams": _RECORDED["SamplingParams"],
    "GuidedDecodingParams": frozenset("json regex grammar json_object structural_tag".split()),
}


class _FakeGeneration:
    """Streams `steps` (cumulative token lists); an aborted one ends with finish_reason 'cancelled'."""

    def __init__(self, steps, finish):
        self.steps, self.finish, self.aborted_flag = steps, finish, False

    def abort(self):
        self.aborted_flag = True

    def __aiter__(self):
        return self._run()

    async def _run(self):
        import asyncio
        for i, tokens in enumerate(self.steps):
            last = i == len(self.steps) - 1
            yield types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=list(tokens), finish_reason=self.finish if last else None)])
        while self.finish is None and not self.aborted_flag:
            await asyncio.sleep(0.005)
        if self.finish is None:
            yield types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=list(self.steps[-1]),
                                                                       finish_reason="cancelled")])


@pytest.fixture
def fake_llmapi(monkeypatch):
    def standin(name):
        allowed = set(_LLMAPI_NAMES[name])

        def __init__(self, **kwargs):
            unknown = set(kwargs) - allowed
            assert not unknown, f"{name}() has no field {sorted(unknown)}"
            self.kwargs = kwargs
        return type(name, (), {"__init__": __init__, "model_fields": dict.fromkeys(allowed)})

    class LLM(standin("LLM")):
        plans = {}

        def generate_async(self, inputs, sampling_params, streaming):
            assert streaming is True and isinstance(inputs, list)
            self.last_params = sampling_params
            return LLM.plans[tuple(inputs)]

        def get_stats(self, timeout):
            return [json.dumps(STATS_154)]

        def shutdown(self):
            self.closed = True

    root, llmapi = types.ModuleType("tensorrt_llm"), types.ModuleType("tensorrt_llm.llmapi")
    root.__version__ = "1.4.0rc4"
    llmapi.LLM, llmapi.SamplingParams, llmapi.GuidedDecodingParams = LLM, standin("SamplingParams"), standin(
        "GuidedDecodingParams")
    llmapi.KvCacheConfig, llmapi.SchedulerConfig = standin("KvCacheConfig"), standin("SchedulerConfig")
    llmapi.CudaGraphConfig, llmapi.TorchLlmArgs = standin("CudaGraphConfig"), standin("TorchLlmArgs")
    llmapi.CapacitySchedulerPolicy = enum.Enum("CapacitySchedulerPolicy",
                                               "MAX_UTILIZATION GUARANTEED_NO_EVICT STATIC_BATCH")
    for mod in (root, llmapi):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    from forge.engines import trtllm_backend
    monkeypatch.setattr(trtllm_backend, "_load_tokenizer",
                        lambda c: types.SimpleNamespace(eos_token_id=2, pad_token_id=None))
    return LLM


def _poll_until(engine, n, timeout_s=5.0):
    import time
    results, tokens, deadline = [], 0, time.monotonic() + timeout_s
    while len(results) < n and time.monotonic() < deadline:
        p = engine.poll(0.05)
        results += p.results
        tokens += p.new_tokens
    return results, tokens


def test_llmapi_engine_wiring(fake_llmapi, caplog):
    from forge.engines import trtllm_backend
    c = contract(artifact=CKPT, kv=KvCache(tokens_per_block=64, max_tokens=4096, host_cache_size=0,
                                           block_reuse=True))
    with caplog.at_level("INFO", logger="forge.engines.trtllm"):
        engine = trtllm_backend.create_engine(c, plan_card(_card(), c))
    llm = engine._llm
    assert llm.kwargs["max_seq_len"] == 1152 and llm.kwargs["enable_iter_perf_stats"] is True
    assert llm.kwargs["kv_cache_config"].kwargs["dtype"] == "fp8"
    assert llm.kwargs["kv_cache_config"].kwargs["use_kv_cache_manager_v2"] is False
    assert llm.kwargs["scheduler_config"].kwargs["capacity_scheduler_policy"].name == "GUARANTEED_NO_EVICT"
    assert llm.kwargs["scheduler_config"].kwargs["enable_prefix_aware_scheduling"] is True
    assert llm.kwargs["cuda_graph_config"].kwargs["batch_sizes"][-1] == 256
    assert (llm.kwargs["disable_overlap_scheduler"], llm.kwargs["stream_interval"], llm.kwargs["max_stats_len"]) == (
        True, 2, 128)
    [record] = [r for r in caplog.records if r.name == "forge.engines.trtllm"]
    assert "TensorRT-LLM 1.4.0rc4" in record.getMessage() and '"stream_interval": 2' in record.getMessage()
    assert engine.describe()["settings"]["kwargs"]["stream_interval"] == 2
    # no per-request seeds in this (stand-in) release: a seeded sampling request is refused, not run unseeded
    engine.submit([EngineRequest("s", (1, 7), 8, sampling=Sampling(temperature=0.9, seed=3))])
    (refused,) = engine.poll(0.0).results
    assert refused.finish_reason == REFUSED and "#17172" in refused.error
    fake_llmapi.plans = {(1, 5): _FakeGeneration([[7], [7, 8], [7, 8, 2]], "stop"),
                         (1, 6): _FakeGeneration([[9]], None)}
    engine.submit([EngineRequest("a", (1, 5), 8, guide=Guide(regex="[0-9]")), EngineRequest("b", (1, 6), 8)])
    results, tokens = _poll_until(engine, 1)
    assert [(r.request_id, r.output_ids, r.finish_reason) for r in results] == [("a", [7, 8, 2], "eos")]
    engine.cancel("b")
    more, more_tokens = _poll_until(engine, 1)
    assert [(r.request_id, r.output_ids, r.finish_reason) for r in more] == [("b", [9], "cancelled")]
    assert tokens + more_tokens == 4
    assert engine.stats().steps == 155
    engine.shutdown(5.0)
    assert llm.closed


def test_llmapi_without_kv_dtype_field_is_refused(fake_llmapi, monkeypatch):
    from forge.engines import trtllm_backend
    monkeypatch.setattr(sys.modules["tensorrt_llm.llmapi"].KvCacheConfig, "model_fields", {"max_tokens": None})
    c = contract(artifact=CKPT)
    with pytest.raises(EngineUnavailable, match=r"::\$\.precision\.kv_cache: TensorRT-LLM 1\.4\.0rc4 has no "
                                                r"KvCacheConfig\.dtype"):
        trtllm_backend.create_engine(c, plan_card(_card(), c))
