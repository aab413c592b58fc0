"""The trtllm backend driven against stand-in bindings whose keyword names are copied from
TensorRT-LLM's binding sources (the executor API) and recorded from its sources (the LLM API): it
proves the wiring, not TensorRT-LLM's behaviour (never run here)."""
from __future__ import annotations

import datetime
import enum
import json
import sys
import types

import pytest

from forge.config.models import KvCache
from forge.config.plan import plan_card
from forge.engines.interface import REFUSED, EngineBusy, EngineRequest, Guide, Sampling
from forge.errors import EngineUnavailable
from tests.engines.trtllm.recorded import recorded_fields
from tests.engines.trtllm.contracts import CKPT, STATS_154, contract, gpu_card as _card


# ----------------------------------------------------------------------------- wiring against
# stand-in bindings Keyword names below are copied from
# cpp/tensorrt_llm/nanobind/executor/{executorConfig,request,executor}.cpp (the pybind versions take
# the same names). A stand-in accepts exactly those names and nothing else.
_NAMES = {
    "ExecutorConfig": "max_beam_width scheduler_config kv_cache_config enable_chunked_context "
    "normalize_log_probs "
    "iter_stats_max_iterations request_stats_max_iterations batching_type "
    "max_batch_size "
    "max_num_tokens parallel_config peft_cache_config "
    "logits_post_processor_config decoding_config "
    "use_gpu_direct_storage gpu_weights_percent max_queue_size "
    "extended_runtime_perf_knob_config "
    "debug_config recv_poll_period_ms max_seq_idle_microseconds spec_dec_config "
    "guided_decoding_config additional_model_outputs cache_transceiver_config "
    "gather_generation_logits mm_embedding_offloading enable_trt_overlap",
    "KvCacheConfig": "enable_block_reuse max_tokens max_attention_window sink_token_length "
    "free_gpu_memory_fraction "
    "host_cache_size onboard_blocks cross_kv_cache_fraction "
    "secondary_offload_min_priority "
    "event_buffer_max_size enable_partial_reuse copy_on_partial_reuse use_uvm "
    "runtime_defaults",
    "SchedulerConfig": "capacity_scheduler_policy context_chunking_policy dynamic_batch_config",
    "ParallelConfig": "communication_type communication_mode device_ids participant_ids "
    "orchestrator_config num_nodes",
    "GuidedDecodingConfig": "backend encoded_vocab tokenizer_str stop_token_ids",
    "SamplingConfig": "top_k top_p top_p_min top_p_reset_ids top_p_decay seed temperature "
    "min_tokens "
    "beam_search_diversity_rate repetition_penalty presence_penalty "
    "frequency_penalty "
    "length_penalty early_stopping no_repeat_ngram_size num_return_sequences "
    "min_p beam_width_array",
    "OutputConfig": "return_log_probs return_context_logits return_generation_logits "
    "exclude_input_from_output "
    "return_encoder_output return_perf_metrics additional_model_outputs",
    "Request": "streaming sampling_config output_config end_id pad_id position_ids bad_words "
    "stop_words "
    "embedding_bias external_draft_tokens_config prompt_tuning_config multimodal_input "
    "multimodal_embedding mrope_config lora_config lookahead_config "
    "kv_cache_retention_config "
    "logits_post_processor_name logits_post_processor encoder_input_token_ids client_id "
    "return_all_generated_tokens priority type context_phase_params "
    "encoder_input_features "
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
    """Records calls; answers await_responses from a script of (executor id, tokens, finish reason
    or None)."""

    def __init__(self, model_path, model_type, executor_config):
        self.config, self.enqueued, self.cancelled, self.timeouts, self.script = (
            executor_config,
            [],
            [],
            [],
            [],
        )
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
    result = types.SimpleNamespace(
        output_token_ids=[tokens],
        is_final=finish is not None,
        finish_reasons=[types.SimpleNamespace(name=finish)] if finish else [],
    )
    return types.SimpleNamespace(
        request_id=eid, result=result, error_msg=error, has_error=lambda: error is not None
    )


@pytest.fixture
def fake_trtllm(monkeypatch):
    ex = types.ModuleType("tensorrt_llm.bindings.executor")
    for name in (
        "ExecutorConfig",
        "KvCacheConfig",
        "SchedulerConfig",
        "ParallelConfig",
        "SamplingConfig",
        "OutputConfig",
        "Request",
    ):
        setattr(ex, name, _standin(name))
    ex.GuidedDecodingConfig = _standin("GuidedDecodingConfig")
    ex.GuidedDecodingConfig.GuidedDecodingBackend = enum.Enum(
        "GuidedDecodingBackend", "XGRAMMAR LLGUIDANCE"
    )
    ex.GuidedDecodingParams = _standin("GuidedDecodingParams")
    ex.GuidedDecodingParams.GuideType = enum.Enum("GuideType", "JSON JSON_SCHEMA REGEX "
                                                               "EBNF_GRAMMAR STRUCTURAL_TAG")
    ex.BatchingType = enum.Enum("BatchingType", "STATIC INFLIGHT")
    ex.CapacitySchedulerPolicy = enum.Enum("CapacitySchedulerPolicy", "MAX_UTILIZATION "
                                                                      "GUARANTEED_NO_EVICT "
                                                                      "STATIC_BATCH")
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
    from forge.engines.trtllm import backend as trtllm_backend
    tokenizer = types.SimpleNamespace(
        eos_token_id=2,
        pad_token_id=0,
        get_vocab=lambda: {"<pad>": 0, "a": 1, "</s>": 2},
        backend_tokenizer=types.SimpleNamespace(to_str=lambda: '{"model": {}}'),
    )
    monkeypatch.setattr(trtllm_backend, "_load_tokenizer", lambda c: tokenizer)
    return ex


def test_executor_engine_wiring(fake_trtllm):
    from forge.engines.trtllm import backend as trtllm_backend
    c = contract(limits=(2, 8192, 1024, 128))
    engine = trtllm_backend.create_engine(c, plan_card(_card(index=3), c))
    fake = engine._executor
    cfg = fake.config.kwargs
    assert cfg["max_queue_size"] == 2 and cfg["batching_type"] is fake_trtllm.BatchingType.INFLIGHT
    assert cfg["kv_cache_config"].kwargs["free_gpu_memory_fraction"] == 0.85
    assert cfg["scheduler_config"].kwargs["capacity_scheduler_policy"].name == "GUARANTEED_NO_EVICT"
    # card 3 under CUDA_VISIBLE_DEVICES=2,3
    assert cfg["parallel_config"].kwargs["device_ids"] == [1]
    assert cfg["guided_decoding_config"].kwargs["encoded_vocab"] == ["<pad>", "a", "</s>"]
    assert engine.supports_guides == frozenset({"choice", "json_schema", "regex"})

    engine.submit(
        [EngineRequest("a", (1, 5), 8), EngineRequest("b", (1,), 8, guide=Guide(choice=("x", "y")))]
    )
    req_a, req_b = fake.enqueued
    assert (
        req_a.args == ([1, 5], 8)
        and req_a.kwargs["end_id"] == 2
        and req_a.kwargs["streaming"] is True
    )
    assert req_a.kwargs["sampling_config"].kwargs == {"top_k": 1}
    assert req_b.kwargs["guided_decoding_params"].args[1] == "(x|y)"
    with pytest.raises(EngineBusy):
        engine.submit([EngineRequest("c", (1,), 8)])                   # 2 slots, both taken

    fake.script = [_response(101, [7]), _response(102, [9])]
    p = engine.poll(0.05)
    assert (
        p.new_tokens == 2
        and p.results == []
        and fake.timeouts[-1] == datetime.timedelta(seconds=0.05)
    )
    engine.cancel("b")
    assert fake.cancelled == [102]
    fake.script = [_response(101, [8, 2], "END_ID"), _response(102, [], "CANCELLED")]
    p = engine.poll(0.05)
    assert [(r.request_id, r.output_ids, r.finish_reason) for r in p.results] == [
        ("a", [7, 8, 2], "eos"), ("b", [9], "cancelled")]

    engine.submit([EngineRequest("d", (1,) * 2000, 8)])  # longer than max_input_len: failed here
    (refused,) = engine.poll(0.0).results
    assert (
        refused.request_id == "d" and refused.finish_reason == REFUSED and len(fake.enqueued) == 2
    )

    stats = engine.stats()
    assert (stats.active, stats.queued, stats.steps) == (1, 3, 155)
    engine.shutdown(5.0)
    assert fake.closed



def test_a_request_the_executor_rejects_is_a_typed_refusal(fake_trtllm):
    """Refused, not failed: the node answers it as the caller's to fix (RequestRejected, HTTP
    400)."""
    from forge.engines.trtllm import backend as trtllm_backend
    c = contract(limits=(2, 8192, 1024, 128))
    engine = trtllm_backend.create_engine(c, plan_card(_card(index=3), c))

    def reject(request):
        raise ValueError("invalid sampling config")

    engine._executor.enqueue_request = reject
    engine.submit([EngineRequest("x", (1, 1), 8)])
    (res,) = engine.poll(0.0).results
    assert res.finish_reason == REFUSED and res.error == "TensorRT-LLM: invalid sampling config"
    engine.shutdown(5.0)

# The LLM API stand-ins accept exactly the fields recorded from TensorRT-LLM's sources
# (tests/engines/trtllm/ fields/); GuidedDecodingParams' fields are from
# tensorrt_llm/sampling_params.py (1.0.0rc4).
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
    """Streams `steps` (cumulative token lists); an aborted one ends with finish_reason
    'cancelled'."""

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
            yield types.SimpleNamespace(
                outputs=[
                    types.SimpleNamespace(token_ids=list(self.steps[-1]), finish_reason="cancelled")
                ]
            )


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
    llmapi.LLM, llmapi.SamplingParams, llmapi.GuidedDecodingParams = (
        LLM,
        standin("SamplingParams"),
        standin("GuidedDecodingParams"),
    )
    llmapi.KvCacheConfig, llmapi.SchedulerConfig = (
        standin("KvCacheConfig"),
        standin("SchedulerConfig"),
    )
    llmapi.CudaGraphConfig, llmapi.TorchLlmArgs = (
        standin("CudaGraphConfig"),
        standin("TorchLlmArgs"),
    )
    llmapi.CapacitySchedulerPolicy = enum.Enum("CapacitySchedulerPolicy",
                                               "MAX_UTILIZATION GUARANTEED_NO_EVICT STATIC_BATCH")
    for mod in (root, llmapi):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    from forge.engines.trtllm import backend as trtllm_backend
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
    from forge.engines.trtllm import backend as trtllm_backend
    c = contract(artifact=CKPT, kv=KvCache(tokens_per_block=64, max_tokens=4096, host_cache_size=0,
                                           block_reuse=True))
    with caplog.at_level("INFO", logger="forge.engines.trtllm"):
        engine = trtllm_backend.create_engine(c, plan_card(_card(), c))
    llm = engine._llm
    assert llm.kwargs["max_seq_len"] == 1152 and llm.kwargs["enable_iter_perf_stats"] is True
    assert llm.kwargs["kv_cache_config"].kwargs["dtype"] == "fp8"
    assert llm.kwargs["kv_cache_config"].kwargs["use_kv_cache_manager_v2"] is False
    assert (
        llm.kwargs["scheduler_config"].kwargs["capacity_scheduler_policy"].name
        == "GUARANTEED_NO_EVICT"
    )
    assert llm.kwargs["scheduler_config"].kwargs["enable_prefix_aware_scheduling"] is True
    assert llm.kwargs["cuda_graph_config"].kwargs["batch_sizes"][-1] == 256
    assert (
        llm.kwargs["disable_overlap_scheduler"],
        llm.kwargs["stream_interval"],
        llm.kwargs["max_stats_len"],
    ) == (True, 2, 128)
    [record] = [r for r in caplog.records if r.name == "forge.engines.trtllm"]
    assert (
        "TensorRT-LLM 1.4.0rc4" in record.getMessage()
        and '"stream_interval": 2' in record.getMessage()
    )
    assert engine.describe()["settings"]["kwargs"]["stream_interval"] == 2
    # no per-request seeds in this (stand-in) release: a seeded sampling request is refused, not run
    # unseeded
    engine.submit([EngineRequest("s", (1, 7), 8, sampling=Sampling(temperature=0.9, seed=3))])
    (refused,) = engine.poll(0.0).results
    assert refused.finish_reason == REFUSED and "#17172" in refused.error
    fake_llmapi.plans = {(1, 5): _FakeGeneration([[7], [7, 8], [7, 8, 2]], "stop"),
                         (1, 6): _FakeGeneration([[9]], None)}
    engine.submit(
        [EngineRequest("a", (1, 5), 8, guide=Guide(regex="[0-9]")), EngineRequest("b", (1, 6), 8)]
    )
    results, tokens = _poll_until(engine, 1)
    assert [(r.request_id, r.output_ids, r.finish_reason) for r in results] == [
        ("a", [7, 8, 2], "eos")
    ]
    engine.cancel("b")
    more, more_tokens = _poll_until(engine, 1)
    assert [(r.request_id, r.output_ids, r.finish_reason) for r in more] == [
        ("b", [9], "cancelled")
    ]
    assert tokens + more_tokens == 4
    assert engine.stats().steps == 155
    engine.shutdown(5.0)
    assert llm.closed


def test_llmapi_without_kv_dtype_field_is_refused(fake_llmapi, monkeypatch):
    from forge.engines.trtllm import backend as trtllm_backend

    monkeypatch.setattr(
        sys.modules["tensorrt_llm.llmapi"].KvCacheConfig, "model_fields", {"max_tokens": None}
    )
    c = contract(artifact=CKPT)
    with pytest.raises(EngineUnavailable, match=r"::\$\.precision\.kv_cache: TensorRT-LLM "
                                                r"1\.4\.0rc4 has no "
                                                r"KvCacheConfig\.dtype"):
        trtllm_backend.create_engine(c, plan_card(_card(), c))
