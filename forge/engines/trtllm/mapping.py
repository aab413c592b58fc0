"""Contract -> the exact TensorRT-LLM objects to build, as plain data. Pure: never imports
tensorrt_llm.

Two paths (field names checked against TensorRT-LLM's sources; see docs/trtllm.md for files and
versions):
  checkpoint  -> tensorrt_llm.LLM on the PyTorch backend (TorchLlmArgs) + SamplingParams: the primary path
  engine_dir  -> tensorrt_llm.bindings.executor: ExecutorConfig / KvCacheConfig / SchedulerConfig, Request
                 (releases up to 1.2.x; the Executor is removed on TensorRT-LLM main)
`engine_arguments(contract, plan, release)` gives what forge passes for a card, for either path.
Enum members travel as their names ("GUARANTEED_NO_EVICT"); the backend looks them up on the real
enums.
"""
from __future__ import annotations

import json
import time
from typing import Any, Mapping, Optional, Sequence, Union

from forge.config.models import Contract
from forge.config.plan import CardPlan
from forge.engines.interface import EngineRequest, Guide, IterationStats, Sampling, sampling_problem
from forge.engines.trtllm.arguments import (ITER_STATS_MAX_ITERATIONS, MAX_TOKENS_MEMORY_CAP,  # noqa: F401
                                            kv_sizing, llm_api_arguments, torch_kv_dtype)
from forge.engines.trtllm.quant import kv_quant_problems
from forge.engines.trtllm.release import Release
from forge.engines.trtllm.section import SECTION, TrtllmSection
from forge.errors import EngineUnavailable, Problem, display_path

CAPACITY_POLICIES = ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")
DEFAULT_CAPACITY_POLICY = "GUARANTEED_NO_EVICT"  # a started request always runs to completion
# engine drops a scheduled request idle this long (its default)
MAX_SEQ_IDLE_MICROSECONDS = 180_000_000
SEED_IGNORED = ("this TensorRT-LLM release ignores a per-request seed on the PyTorch path "
                "(per-request seeds in "
                "TorchSampler arrived with NVIDIA/TensorRT-LLM#17172): send the request without a "
                "seed")

_REGEX_META = set("\\.^$|?*+()[]{}")
_REGEX_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


# ----------------------------------------------------------------------------- contract checks
def contract_problems(contract: Contract) -> list[Problem]:
    """Everything that stops a trtllm engine being built from this contract, one Problem each."""
    where, out = contract_where(contract), []
    if contract.target.kind != "gpu":
        out.append(Problem(where, "$.target.kind", "backend trtllm runs only on NVIDIA GPUs; "
                                                   "target.kind must be gpu"))
    if contract.artifact.engine_dir is not None and contract.artifact.tokenizer is None:
        out.append(Problem(where, "$.artifact.tokenizer",
                           "a TensorRT-LLM engine directory holds no tokenizer; name the tokenizer "
                           "directory"))
    return out + trtllm_refusals(contract)


def trtllm_refusals(contract: Contract) -> list[Problem]:
    """What TensorRT-LLM itself would refuse or silently change (the core checks do not know
    these)."""
    where, out = contract_where(contract), []
    kv, prec = contract.kv_cache, contract.precision
    if kv.free_gpu_memory_fraction is not None and kv.free_gpu_memory_fraction >= 1.0:
        out.append(Problem(where, "$.kv_cache.free_gpu_memory_fraction",
                           "TensorRT-LLM requires a fraction below 1.0 (it refuses 1.0 at start); "
                           "use e.g. 0.95"))
    section = contract.sections.get(SECTION)
    if contract.artifact.checkpoint is not None:
        if torch_kv_dtype(contract) is None:
            out.append(Problem(where, "$.precision.kv_cache",
                               "TensorRT-LLM's PyTorch backend stores the KV cache as fp8 or in "
                               "the model dtype; "
                               f"kv_cache {prec.kv_cache} with weights {prec.weights} cannot be "
                               "honoured"))
        if not isinstance(section, TrtllmSection):
            out.append(Problem(where, f"$.{SECTION}", "a trtllm checkpoint contract must state its "
                                                      "trtllm: section "
                               "(prefix_aware_scheduling, overlap_scheduler, stream_interval): "
                               "TensorRT-LLM's "
                               "defaults for them change admission, the token budget and the "
                               "response rate"))
        out += kv_quant_problems(contract, where)
    elif section is not None:
        out.append(Problem(where, f"$.{SECTION}", "an engine directory runs on the Executor, which "
                                                  "has none of these "
                           "switches (they are TorchLlmArgs fields of the checkpoint path); remove "
                           "the section"))
    return out


def contract_where(contract: Contract) -> str:
    """The contract's file as the user should read it, or its name when it was built in code."""
    return display_path(contract.source) if contract.source else f"<contract {contract.contract}>"


def _check_policy(policy: str) -> str:
    if policy not in CAPACITY_POLICIES:
        raise ValueError("capacity scheduler policy must be one of "
                         f"{', '.join(CAPACITY_POLICIES)}, got {policy!r}")
    return policy


def queue_bound(contract: Contract) -> int:
    """Requests the engine may hold waiting beyond its slots: one more batch, never unbounded."""
    return contract.limits.max_batch_size


# ----------------------------------------------------------------------------- engine_dir: Executor
# API
def executor_config_spec(
    contract: Contract,
    device_ordinal: int,
    *,
    capacity_scheduler_policy: str = DEFAULT_CAPACITY_POLICY,
) -> dict[str, Any]:
    """kwargs for tensorrt_llm.bindings.executor.ExecutorConfig (nested configs as dicts of their
    kwargs).

    tokens_per_block, max_input_len, max_seq_len and the KV dtype are baked into the engine at build
    time; the Executor takes no runtime value for them (validation compares the engine's
    config.json)."""
    lim, kv = contract.limits, contract.kv_cache
    return {
        "max_beam_width": 1,
        "max_batch_size": lim.max_batch_size,
        "max_num_tokens": lim.max_num_tokens,
        "batching_type": "INFLIGHT",
        # max_num_tokens >= max_input_len (validated), so a prompt fits one step; chunking would
        # also need an engine built with use_paged_context_fmha. The binding defaults to False, the
        # C++ header to true.
        "enable_chunked_context": False,
        "iter_stats_max_iterations": ITER_STATS_MAX_ITERATIONS,
        "request_stats_max_iterations": 0,
        "max_queue_size": queue_bound(contract),
        "max_seq_idle_microseconds": MAX_SEQ_IDLE_MICROSECONDS,
        "scheduler_config": {"capacity_scheduler_policy": _check_policy(capacity_scheduler_policy)},
        "kv_cache_config": {"enable_block_reuse": kv.block_reuse, **kv_sizing(contract),
                            "host_cache_size": kv.host_cache_bytes, "onboard_blocks": True},
        "parallel_config": {"communication_type": "MPI", "communication_mode": "LEADER",
                            "device_ids": [device_ordinal]},
    }


def guided_decoding_config_spec(
    vocab: Mapping[str, int], tokenizer_json: str, eos_id: int
) -> dict[str, Any]:
    """kwargs for GuidedDecodingConfig: XGrammar needs the vocabulary in id order and the fast
    tokenizer's JSON."""
    return {
        "backend": "XGRAMMAR",
        "encoded_vocab": [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])],
        "tokenizer_str": tokenizer_json,
        "stop_token_ids": [eos_id],
    }


def executor_request_spec(prompt_ids: Sequence[int], max_new_tokens: int, sampling: Sampling,
                          guide: Optional[Guide], eos_id: int, pad_id: int) -> dict[str, Any]:
    """kwargs for executor.Request (sampling_config / output_config / guided_decoding_params as
    dicts)."""
    return {
        "input_token_ids": list(prompt_ids),
        "max_tokens": max_new_tokens,  # always explicit: the request's own output budget
        "streaming": True,             # a response per step: new tokens are counted as they come
        # -1 disables EOS (as the LLM API's ignore_eos)
        "end_id": eos_id if sampling.stop_at_eos else -1,
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


# ----------------------------------------------------------------------------- what forge passes
# for a card
def engine_arguments(contract: Contract, plan: CardPlan, release: Release, *,
                     capacity_scheduler_policy: str = DEFAULT_CAPACITY_POLICY,
                     device_ordinal: Optional[int] = None) -> dict[str, Any]:
    """Exactly what forge passes to TensorRT-LLM for this card, as plain data: {"api": what is
    constructed, "release": the release it was checked against, "kwargs": its keyword arguments
    (nested configs as dicts), "not_passed": {argument: why it was left out}}. Pure. Raises
    EngineUnavailable, in one line naming the contract field, where the release cannot honour the
    contract (e.g. an engine_dir without the Executor)."""
    _check_policy(capacity_scheduler_policy)
    where = contract_where(contract)
    if contract.artifact.engine_dir is not None:
        if not release.has_executor:
            raise EngineUnavailable(
                f"{where}::$.artifact.engine_dir: TensorRT-LLM {release.version} has no Executor "
                "API (the TensorRT "
                "backend ships up to 1.2.x and is removed after): an engine_dir needs a release <= "
                "1.2.x; or name a "
                "checkpoint for the LLM API's PyTorch path")
        ordinal = plan.card.index if device_ordinal is None else device_ordinal
        return {
            "api": "tensorrt_llm.bindings.executor.Executor(engine_dir, DECODER_ONLY, "
            "ExecutorConfig(**kwargs))",
            "release": release.version,
            "kwargs": executor_config_spec(
                contract, ordinal, capacity_scheduler_policy=capacity_scheduler_policy
            ),
            "not_passed": {},
        }
    checkpoint = contract.resolve(contract.artifact.checkpoint)
    tokenizer = contract.resolve(contract.artifact.tokenizer or contract.artifact.checkpoint)
    kwargs, not_passed = llm_api_arguments(
        contract,
        release,
        checkpoint,
        tokenizer,
        capacity_scheduler_policy=capacity_scheduler_policy,
        where=where,
    )
    return {
        "api": "tensorrt_llm.LLM(**kwargs) on the PyTorch backend (TorchLlmArgs)",
        "release": release.version,
        "kwargs": kwargs,
        "not_passed": not_passed,
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


# ----------------------------------------------------------------------------- shared request
# pieces
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
    """A regex for a choice or regex guide. TensorRT-LLM has no choice guide: a choice is an
    alternation."""
    if guide.regex is not None:
        return guide.regex
    if not guide.choice:
        raise ValueError("a guide needs exactly one of choice | json_schema | regex")
    return "(" + "|".join(escape_regex(c) for c in guide.choice) + ")"


def escape_regex(text: str) -> str:
    """Escape only the regex metacharacters (XGrammar's dialect does not know Python's extra
    escapes)."""
    return "".join("\\" + ch if ch in _REGEX_META else _REGEX_CONTROL.get(ch, ch) for ch in text)


def request_refusal(contract: Contract, r: EngineRequest, supports_guides: frozenset[str], *,
                    seed_honoured: bool = True) -> Optional[str]:
    """Why a trtllm engine must fail this request itself (None: send it). seed_honoured: whether the
    engine honours a per-request seed (False on PyTorch-path releases without per-request seeds)."""
    lim = contract.limits
    if r.want_hidden:
        return "backend trtllm does not return hidden states"
    why = sampling_problem(r.sampling)
    if why is not None:
        return why
    if r.sampling.seed is not None and r.sampling.temperature > 0.0 and not seed_honoured:
        return SEED_IGNORED
    if len(r.prompt_ids) > lim.max_input_len or r.max_new_tokens > lim.max_output_len:
        # TensorRT-LLM rejects a long prompt but silently shortens a long output: refuse both up
        # front
        return (f"request of {len(r.prompt_ids)}+{r.max_new_tokens} tokens exceeds the contract's "
                f"{lim.max_input_len}+{lim.max_output_len}")
    if r.guide is not None:
        kind = (
            "choice"
            if r.guide.choice
            else "json_schema"
            if r.guide.json_schema is not None
            else "regex"
        )
        if kind not in supports_guides:
            return (f"this trtllm engine cannot guide output by {kind} (guides need a fast "
                    "tokenizer)")
    return None


# ----------------------------------------------------------------------------- results and stats
_EXECUTOR_FINISH = {
    "END_ID": "eos",
    "STOP_WORDS": "stop",
    "LENGTH": "length",
    "CANCELLED": "cancelled",
}
_LLMAPI_FINISH = {"stop": "eos", "length": "length", "cancelled": "cancelled"}


def finish_reason_from_executor(name: str) -> tuple[str, Optional[str]]:
    """executor.FinishReason member name -> (forge finish_reason, error or None)."""
    if name in _EXECUTOR_FINISH:
        return _EXECUTOR_FINISH[name], None
    if name == "TIMED_OUT":
        return (
            "error",
            "TensorRT-LLM timed the request out (max_seq_idle_microseconds or allotted time)",
        )
    return "error", f"TensorRT-LLM ended the request without a finish reason ({name})"


def finish_reason_from_llmapi(reason: Optional[str]) -> tuple[str, Optional[str]]:
    """CompletionOutput.finish_reason ('stop' | 'length' | 'timeout' | 'cancelled' | None) ->
    forge's."""
    if reason in _LLMAPI_FINISH:
        return _LLMAPI_FINISH[reason], None
    return "error", f"TensorRT-LLM ended the request with finish_reason {reason!r}"


def iteration_stats_from_json(item: Union[str, Mapping[str, Any]]) -> IterationStats:
    """One IterationStats JSON object (Executor to_json_str() / LLM.get_stats()) -> forge's
    IterationStats."""
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


def latest_iteration_stats(
    items: Sequence[Union[str, Mapping[str, Any]]],
) -> Optional[IterationStats]:
    """The newest of a batch of stats (highest `iter`), or None for an empty batch."""
    parsed = [json.loads(i) if isinstance(i, str) else i for i in items]
    if not parsed:
        return None
    return iteration_stats_from_json(max(parsed, key=lambda d: int(d.get("iter", -1))))


def idle_stats(last: IterationStats) -> IterationStats:
    """Stats for an engine that ran no step since `last` and holds no request (it only steps with
    work)."""
    return IterationStats(kv_blocks_used=last.kv_blocks_used, kv_blocks_free=last.kv_blocks_free,
                          steps=last.steps, prefix_hit_tokens=last.prefix_hit_tokens)


def cuda_device_ordinal(card_index: int, visible: Optional[str]) -> int:
    """The CUDA ordinal of a card (its index is its NVML index) given CUDA_VISIBLE_DEVICES (None =
    unset). Assumes CUDA_DEVICE_ORDER=PCI_BUS_ID, which the backend sets, so CUDA and NVML count
    alike."""
    if visible is None:
        return card_index
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if str(card_index) not in ids:
        raise ValueError(f"card {card_index} is hidden by CUDA_VISIBLE_DEVICES={visible!r}")
    return ids.index(str(card_index))
