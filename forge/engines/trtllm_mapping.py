"""Contract -> the exact TensorRT-LLM objects to build, as plain data. Pure: never imports tensorrt_llm.

Two paths (field names verified against TensorRT-LLM sources; see docs/trtllm.md for files and versions):
  engine_dir  -> tensorrt_llm.bindings.executor: ExecutorConfig / KvCacheConfig / SchedulerConfig, Request
  checkpoint  -> tensorrt_llm.LLM (PyTorch backend, TorchLlmArgs) + SamplingParams
Enum members travel as their names ("GUARANTEED_NO_EVICT"); the backend looks them up on the real enums.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from forge.config.models import Contract
from forge.engines.interface import EngineRequest, Guide, IterationStats, Sampling, sampling_problem
from forge.errors import Problem, display_path

CAPACITY_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")
DEFAULT_CAPACITY_POLICY = "GUARANTEED_NO_EVICT"  # a started request always runs to completion
# With `max_tokens` TensorRT-LLM still caps the pool by a share of free memory (the smaller wins; unset
# means 0.9 in kvCacheManager.cpp). We state that cap instead of inheriting it, and the same value.
MAX_TOKENS_MEMORY_CAP = 0.9
ITER_STATS_MAX_ITERATIONS = 128          # stats kept between two stats() calls (bounded memory)
MAX_SEQ_IDLE_MICROSECONDS = 180_000_000  # engine drops a scheduled request idle this long (its default)
GUIDED_DECODING_BACKEND = "xgrammar"     # the only one the C++ runtime supports

_WEIGHT_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "auto", "int4": "auto"}
_REGEX_META = set("\\.^$|?*+()[]{}")
_REGEX_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


# ----------------------------------------------------------------------------- contract checks
def contract_problems(contract: Contract) -> list[Problem]:
    """Everything that stops a trtllm engine being built from this contract, one Problem each."""
    where, out = contract_where(contract), []
    if contract.target.kind != "gpu":
        out.append(Problem(where, "$.target.kind", "backend trtllm runs only on NVIDIA GPUs; target.kind must be gpu"))
    if contract.artifact.engine_dir is not None and contract.artifact.tokenizer is None:
        out.append(Problem(where, "$.artifact.tokenizer",
                           "a TensorRT-LLM engine directory holds no tokenizer; name the tokenizer directory"))
    return out + trtllm_refusals(contract)


def trtllm_refusals(contract: Contract) -> list[Problem]:
    """What TensorRT-LLM itself would refuse or silently change (the core checks do not know these)."""
    where, out = contract_where(contract), []
    kv, prec = contract.kv_cache, contract.precision
    if kv.free_gpu_memory_fraction is not None and kv.free_gpu_memory_fraction >= 1.0:
        out.append(Problem(where, "$.kv_cache.free_gpu_memory_fraction",
                           "TensorRT-LLM requires a fraction below 1.0 (it refuses 1.0 at start); use e.g. 0.95"))
    if contract.artifact.checkpoint is not None and torch_kv_dtype(contract) is None:
        out.append(Problem(where, "$.precision.kv_cache",
                           f"TensorRT-LLM's PyTorch backend stores the KV cache as fp8 or in the model dtype; "
                           f"kv_cache {prec.kv_cache} with weights {prec.weights} cannot be honoured"))
    return out


def contract_where(contract: Contract) -> str:
    """The contract's file as the user should read it, or its name when it was built in code."""
    return display_path(contract.source) if contract.source else f"<contract {contract.contract}>"


def torch_kv_dtype(contract: Contract) -> Optional[str]:
    """KvCacheConfig.dtype for the PyTorch backend: 'fp8', or 'auto' (= the model dtype) when that is what the
    contract states; None when the contract asks for something the backend cannot store."""
    kv, weights = contract.precision.kv_cache, contract.precision.weights
    if kv == "fp8":
        return "fp8"
    if kv == weights or (weights in ("fp8", "int4") and kv in ("bf16", "fp16")):
        return "auto"   # quantized checkpoints keep 16-bit activations; the checkpoint config decides which
    return None


def _check_policy(policy: str) -> str:
    if policy not in CAPACITY_POLICIES:
        raise ValueError(f"capacity scheduler policy must be one of {', '.join(CAPACITY_POLICIES)}, got {policy!r}")
    return policy


def _kv_sizing(contract: Contract) -> dict[str, Any]:
    kv = contract.kv_cache
    if kv.max_tokens is not None:
        return {"max_tokens": kv.max_tokens, "free_gpu_memory_fraction": MAX_TOKENS_MEMORY_CAP}
    return {"max_tokens": None, "free_gpu_memory_fraction": kv.free_gpu_memory_fraction}


def queue_bound(contract: Contract) -> int:
    """Requests the engine may hold waiting beyond its slots: one more batch, never unbounded."""
    return contract.limits.max_batch_size


# ----------------------------------------------------------------------------- engine_dir: Executor API
def executor_config_spec(contract: Contract, device_ordinal: int, *,
                         capacity_scheduler_policy: str = DEFAULT_CAPACITY_POLICY) -> dict[str, Any]:
    """kwargs for tensorrt_llm.bindings.executor.ExecutorConfig (nested configs as dicts of their kwargs).

    tokens_per_block, max_input_len, max_seq_len and the KV dtype are baked into the engine at build time;
    the Executor takes no runtime value for them (validation compares the engine's config.json)."""
    lim, kv = contract.limits, contract.kv_cache
    return {
        "max_beam_width": 1,
        "max_batch_size": lim.max_batch_size,
        "max_num_tokens": lim.max_num_tokens,
        "batching_type": "INFLIGHT",
        # max_num_tokens >= max_input_len (validated), so a prompt fits one step; chunking would also need
        # an engine built with use_paged_context_fmha. The binding defaults to False, the C++ header to true.
        "enable_chunked_context": False,
        "iter_stats_max_iterations": ITER_STATS_MAX_ITERATIONS,
        "request_stats_max_iterations": 0,
        "max_queue_size": queue_bound(contract),
        "max_seq_idle_microseconds": MAX_SEQ_IDLE_MICROSECONDS,
        "scheduler_config": {"capacity_scheduler_policy": _check_policy(capacity_scheduler_policy)},
        "kv_cache_config": {"enable_block_reuse": kv.block_reuse, **_kv_sizing(contract),
                            "host_cache_size": kv.host_cache_bytes, "onboard_blocks": True},
        "parallel_config": {"communication_type": "MPI", "communication_mode": "LEADER",
                            "device_ids": [device_ordinal]},
    }


def guided_decoding_config_spec(vocab: Mapping[str, int], tokenizer_json: str, eos_id: int) -> dict[str, Any]:
    """kwargs for GuidedDecodingConfig: XGrammar needs the vocabulary in id order and the fast tokenizer's JSON."""
    return {"backend": "XGRAMMAR", "encoded_vocab": [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])],
            "tokenizer_str": tokenizer_json, "stop_token_ids": [eos_id]}


def executor_request_spec(prompt_ids: Sequence[int], max_new_tokens: int, sampling: Sampling,
                          guide: Optional[Guide], eos_id: int, pad_id: int) -> dict[str, Any]:
    """kwargs for executor.Request (sampling_config / output_config / guided_decoding_params as dicts)."""
    return {
        "input_token_ids": list(prompt_ids),
        "max_tokens": max_new_tokens,               # always explicit: the request's own output budget
        "streaming": True,                          # a response per step: new tokens are counted as they come
        "end_id": eos_id if sampling.stop_at_eos else -1,   # -1 disables EOS (as the LLM API's ignore_eos)
        "pad_id": pad_id,
        "sampling_config": sampling_config_spec(sampling),
        "output_config": {"exclude_input_from_output": True},
        "guided_decoding_params": executor_guide_spec(guide),
    }


def executor_guide_spec(guide: Optional[Guide]) -> Optional[dict[str, str]]:
    """GuidedDecodingParams(guide_type=GuideType.<name>, guide=<text>) for the Executor."""
    if guide is None:
        return None
    if guide.json_schema is not None:
        return {"guide_type": "JSON_SCHEMA", "guide": json.dumps(guide.json_schema)}
    return {"guide_type": "REGEX", "guide": guide_regex(guide)}


# ----------------------------------------------------------------------------- checkpoint: LLM API (PyTorch)
def torch_llm_args_spec(contract: Contract, checkpoint: Path, tokenizer: Path, *,
                        capacity_scheduler_policy: str = DEFAULT_CAPACITY_POLICY) -> dict[str, Any]:
    """kwargs for tensorrt_llm.LLM(...) on the PyTorch backend (TorchLlmArgs field names)."""
    lim, kv = contract.limits, contract.kv_cache
    return {
        "model": str(checkpoint),
        "tokenizer": str(tokenizer),
        "dtype": _WEIGHT_DTYPE[contract.precision.weights],
        "load_format": "dummy" if contract.artifact.random_weights else "auto",
        "tensor_parallel_size": 1,                  # one engine per card
        "max_batch_size": lim.max_batch_size,
        "max_num_tokens": lim.max_num_tokens,
        "max_input_len": lim.max_input_len,
        "max_seq_len": lim.max_input_len + lim.max_output_len,
        "max_beam_width": 1,
        "enable_chunked_prefill": False,
        "enable_iter_perf_stats": True,             # off by default: get_stats() would return nothing
        "iter_stats_max_iterations": ITER_STATS_MAX_ITERATIONS,
        "guided_decoding_backend": GUIDED_DECODING_BACKEND,
        "scheduler_config": {"capacity_scheduler_policy": _check_policy(capacity_scheduler_policy)},
        "kv_cache_config": {"tokens_per_block": kv.tokens_per_block, "dtype": torch_kv_dtype(contract) or "auto",
                            "enable_block_reuse": kv.block_reuse, **_kv_sizing(contract),
                            "host_cache_size": kv.host_cache_bytes},
    }


def sampling_params_spec(max_new_tokens: int, sampling: Sampling, guide: Optional[Guide],
                         eos_id: int, pad_id: int) -> dict[str, Any]:
    """kwargs for tensorrt_llm.SamplingParams. max_tokens is ALWAYS set: its default is 32."""
    spec: dict[str, Any] = {"max_tokens": max_new_tokens, "end_id": eos_id, "pad_id": pad_id,
                            "ignore_eos": not sampling.stop_at_eos, "n": 1, "detokenize": False,
                            **sampling_config_spec(sampling)}
    if guide is not None:
        spec["guided_decoding"] = ({"json": guide.json_schema} if guide.json_schema is not None
                                   else {"regex": guide_regex(guide)})
    return spec


# ----------------------------------------------------------------------------- shared request pieces
def sampling_config_spec(sampling: Sampling) -> dict[str, Any]:
    """SamplingConfig / SamplingParams sampling fields. Greedy (temperature 0) is top_k=1."""
    if sampling.temperature <= 0.0:
        return {"top_k": 1}
    spec: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    if sampling.top_k > 0:
        spec["top_k"] = sampling.top_k     # unset = the runtime's 0 = every token
    if sampling.seed is not None:
        spec["seed"] = sampling.seed
    return spec


def guide_regex(guide: Guide) -> str:
    """A regex for a choice or regex guide. TensorRT-LLM has no choice guide: a choice is an alternation."""
    if guide.regex is not None:
        return guide.regex
    if not guide.choice:
        raise ValueError("a guide needs exactly one of choice | json_schema | regex")
    return "(" + "|".join(escape_regex(c) for c in guide.choice) + ")"


def escape_regex(text: str) -> str:
    """Escape only the regex metacharacters (XGrammar's dialect does not know Python's extra escapes)."""
    return "".join("\\" + ch if ch in _REGEX_META else _REGEX_CONTROL.get(ch, ch) for ch in text)


def request_refusal(contract: Contract, r: EngineRequest, supports_guides: frozenset[str]) -> Optional[str]:
    """Why a trtllm engine must fail this request itself (None: send it)."""
    lim = contract.limits
    if r.want_hidden:
        return "backend trtllm does not return hidden states"
    why = sampling_problem(r.sampling)
    if why is not None:
        return why
    if len(r.prompt_ids) > lim.max_input_len or r.max_new_tokens > lim.max_output_len:
        # TensorRT-LLM rejects a long prompt but silently shortens a long output: refuse both up front
        return (f"request of {len(r.prompt_ids)}+{r.max_new_tokens} tokens exceeds the contract's "
                f"{lim.max_input_len}+{lim.max_output_len}")
    if r.guide is not None:
        kind = "choice" if r.guide.choice else "json_schema" if r.guide.json_schema is not None else "regex"
        if kind not in supports_guides:
            return f"this trtllm engine cannot guide output by {kind} (guides need a fast tokenizer)"
    return None


# ----------------------------------------------------------------------------- results and stats
_EXECUTOR_FINISH = {"END_ID": "eos", "STOP_WORDS": "stop", "LENGTH": "length", "CANCELLED": "cancelled"}
_LLMAPI_FINISH = {"stop": "eos", "length": "length", "cancelled": "cancelled"}


def finish_reason_from_executor(name: str) -> tuple[str, Optional[str]]:
    """executor.FinishReason member name -> (forge finish_reason, error or None)."""
    if name in _EXECUTOR_FINISH:
        return _EXECUTOR_FINISH[name], None
    if name == "TIMED_OUT":
        return "error", "TensorRT-LLM timed the request out (max_seq_idle_microseconds or allotted time)"
    return "error", f"TensorRT-LLM ended the request without a finish reason ({name})"


def finish_reason_from_llmapi(reason: Optional[str]) -> tuple[str, Optional[str]]:
    """CompletionOutput.finish_reason ('stop' | 'length' | 'timeout' | 'cancelled' | None) -> forge's."""
    if reason in _LLMAPI_FINISH:
        return _LLMAPI_FINISH[reason], None
    return "error", f"TensorRT-LLM ended the request with finish_reason {reason!r}"


def iteration_stats_from_json(item: Union[str, Mapping[str, Any]]) -> IterationStats:
    """One IterationStats JSON object (Executor to_json_str() / LLM.get_stats()) -> forge's IterationStats."""
    d = json.loads(item) if isinstance(item, str) else item
    kv = d.get("kvCacheStats") or {}
    ifb = d.get("inflightBatchingStats") or {}
    tokens_per_block = int(kv.get("tokensPerBlock") or 0)
    return IterationStats(
        timestamp=time.time(),
        active=int(d.get("numActiveRequests") or 0),
        queued=int(d.get("numQueuedRequests") or 0),
        kv_blocks_used=int(kv.get("usedNumBlocks") or 0),
        kv_blocks_free=int(kv.get("freeNumBlocks") or 0),
        # context tokens of this step plus one token per generation request (beam 1, no drafting)
        tokens_last_step=int(ifb.get("numCtxTokens") or 0) + int(ifb.get("numGenRequests") or 0),
        steps=int(d.get("iter", -1)) + 1,          # `iter` counts from 0
        # reusedBlocks is cumulative; whole blocks only, so partial-block reuse is not counted
        prefix_hit_tokens=int(kv.get("reusedBlocks") or 0) * tokens_per_block,
    )


def latest_iteration_stats(items: Sequence[Union[str, Mapping[str, Any]]]) -> Optional[IterationStats]:
    """The newest of a batch of stats (highest `iter`), or None for an empty batch."""
    parsed = [json.loads(i) if isinstance(i, str) else i for i in items]
    if not parsed:
        return None
    return iteration_stats_from_json(max(parsed, key=lambda d: int(d.get("iter", -1))))


def idle_stats(last: IterationStats) -> IterationStats:
    """Stats for an engine that ran no step since `last` and holds no request (it only steps with work)."""
    return IterationStats(kv_blocks_used=last.kv_blocks_used, kv_blocks_free=last.kv_blocks_free,
                          steps=last.steps, prefix_hit_tokens=last.prefix_hit_tokens)


def cuda_device_ordinal(card_index: int, visible: Optional[str]) -> int:
    """The CUDA ordinal of a card (its index is its NVML index) given CUDA_VISIBLE_DEVICES (None = unset).
    Assumes CUDA_DEVICE_ORDER=PCI_BUS_ID, which the backend sets, so CUDA and NVML count alike."""
    if visible is None:
        return card_index
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if str(card_index) not in ids:
        raise ValueError(f"card {card_index} is hidden by CUDA_VISIBLE_DEVICES={visible!r}")
    return ids.index(str(card_index))
