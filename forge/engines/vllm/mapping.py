"""A contract and its card plan as vLLM engine arguments: PURE (no vLLM import), every field mapped
explicitly.

    limits.max_num_tokens          -> max_num_batched_tokens
    limits.max_batch_size          -> max_num_seqs
    limits.max_input_len + output  -> max_model_len (forge refuses over-long inputs itself)
    kv_cache.max_tokens / fraction -> kv_cache_memory_bytes (the plan's pool) and num_gpu_blocks_override (its blocks)
    the card plan (one engine)     -> gpu_memory_utilization (its weights + pool over the card's memory, rounded up)
    kv_cache.tokens_per_block      -> block_size
    kv_cache.host_cache_size       -> kv_offloading_size (GiB; None when 0) + kv_offloading_backend
    kv_cache.block_reuse           -> enable_prefix_caching
    precision.weights / kv_cache   -> dtype / kv_cache_dtype
    artifact.checkpoint/tokenizer  -> model / tokenizer, load_format ("dummy" for random_weights)
    vllm.*                         -> enforce_eager, attention_backend, async_scheduling, enable_chunked_prefill,
                                      long_prefill_token_threshold, structured_outputs_config, stream_interval, seed
    fixed by forge                 -> guided JSON without free whitespace (xgrammar, guidance: the backends vLLM
                                      allows it with), generation_config="vllm" (the checkpoint's generation_config.json never changes
                                      sampling), one device (tensor/pipeline parallel 1), the engine core in the card
                                      worker's process (executor "uni", VLLM_ENABLE_V1_MULTIPROCESSING=0: see
                                      forge/engines/vllm/engine.py), scheduler_reserve_full_isl, stats on

Environment (`environment()`): VLLM_CPU_KVCACHE_SPACE is cleared, because vLLM's CPU platform lets
it override kv_cache_memory_bytes; VLLM_ENABLE_V1_MULTIPROCESSING is set to 0;
VLLM_CONFIGURE_LOGGING to 0."""
from __future__ import annotations

import math
from typing import Any, Optional

from forge.config.models import Contract
from forge.config.plan import CardPlan
from forge.config.units import GIB
from forge.engines.vllm import rules
from forge.engines.vllm.section import VllmSection
from forge.errors import ConfigError, Problem, display_path

BACKEND = "vllm"
# vLLM's dtype per contract precision (ModelDType); fp8 / int4 weights need a quantized checkpoint:
# not mapped.
WEIGHT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# vLLM's CacheDType has no float32: an fp32 cache is "auto" (the model's dtype) with fp32 weights
# only.
KV_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "fp8"}
# VLLM_CONFIGURE_LOGGING=0: vLLM's loggers get no handler of their own and reach Python's root
# logger, which in a card worker writes to the card's log file and says each class of warning that
# matters once on the console (forge/host/engine_log.py); vLLM's own handler would print every line
# to the job's console.
ENV_SET = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CONFIGURE_LOGGING": "0"}
ENV_CLEAR = ("VLLM_CPU_KVCACHE_SPACE",)


def where(contract: Contract) -> str:
    return display_path(contract.source) if contract.source else f"<contract {contract.contract}>"


def section(contract: Contract) -> VllmSection:
    """The contract's `vllm:` section as its model, or one line naming what is missing."""
    raw = contract.sections.get(BACKEND)
    if isinstance(raw, VllmSection):
        return raw
    if raw is None:
        raise ConfigError([Problem(where(contract), "$.vllm", missing_section_message())])
    return VllmSection.model_validate(raw)


def missing_section_message() -> str:
    return (
        "backend vllm needs a vllm: section stating every field ("
        + ", ".join(VllmSection.model_fields)
        + "); vLLM would choose each by device and model"
    )


def kv_cache_dtype(contract: Contract) -> Optional[str]:
    """vLLM's kv_cache_dtype for the contract's precision, or None when vLLM cannot store it."""
    kv, weights = contract.precision.kv_cache, contract.precision.weights
    if kv == weights:
        return "auto"                 # the model's dtype, which `dtype` sets to exactly this
    return KV_DTYPES.get(kv)


INSTALLED = "installed"


def problems(contract: Contract, vllm_version=INSTALLED) -> list[Problem]:
    """What vLLM would refuse, or silently change, in a vllm contract: one Problem each, at the
    field. Version rules for `vllm_version` ((major, minor); the installed release by default; None:
    every supported release)."""
    w, out = where(contract), []
    raw = contract.sections.get(BACKEND)
    if raw is None:
        return [Problem(w, "$.vllm", missing_section_message())]
    sec = raw if isinstance(raw, VllmSection) else VllmSection.model_validate(raw)
    lim, kv, prec = contract.limits, contract.kv_cache, contract.precision
    if contract.artifact.checkpoint is None:
        out.append(Problem(w, "$.artifact.checkpoint", "backend vllm loads a Hugging Face "
                                                       "checkpoint directory"))
    if prec.weights not in WEIGHT_DTYPES:
        out.append(
            Problem(
                w,
                "$.precision.weights",
                "backend vllm maps weights "
                f"{', '.join(WEIGHT_DTYPES)}; "
                f"{prec.weights} needs a quantized checkpoint, which forge does not map",
            )
        )
    elif kv_cache_dtype(contract) is None:
        out.append(Problem(w, "$.precision.kv_cache", "vLLM stores the KV cache in the model "
                                                      "dtype, bf16, fp16 or "
                           f"fp8; kv_cache {prec.kv_cache} with weights {prec.weights} cannot be "
                           "honoured"))
    if not sec.chunked_prefill and lim.max_num_tokens < lim.max_input_len + lim.max_output_len:
        out.append(Problem(w, "$.vllm.chunked_prefill", f"false needs limits.max_num_tokens "
                           f"({lim.max_num_tokens}) >= max_input_len + max_output_len "
                           f"({lim.max_input_len + lim.max_output_len}): vLLM schedules a whole "
                           "prompt in one step"))
    if sec.long_prefill_token_threshold > lim.max_num_tokens:
        out.append(
            Problem(
                w,
                "$.vllm.long_prefill_token_threshold",
                f"{sec.long_prefill_token_threshold} is above "
                f"limits.max_num_tokens ({lim.max_num_tokens}): no chunk can be that "
                "large",
            )
        )
    version = rules.installed_version() if vllm_version == INSTALLED else vllm_version
    out += rules.version_problems(contract, w, sec.seed, version)
    if contract.target.kind == "cpu":
        if sec.async_scheduling:
            out.append(Problem(w, "$.vllm.async_scheduling", "vLLM's CPU platform turns async "
                                                             "scheduling off; a cpu "
                               "target must say false"))
        if sec.attention_backend != "CPU_ATTN":
            out.append(Problem(w, "$.vllm.attention_backend", f"{sec.attention_backend}: vLLM's "
                                                              "CPU platform runs "
                               "CPU_ATTN only"))
        if kv.host_cache_bytes:
            out.append(Problem(w, "$.kv_cache.host_cache_size", "a cpu target's KV pool is already "
                                                                "in host memory: "
                               "host_cache_size must be 0"))
    return out


def gpu_memory_utilization(plan: CardPlan) -> float:
    """The share of the card one engine of this plan takes: its weights and KV pool over the card's
    memory, rounded up to 0.001. With kv_cache_memory_bytes given vLLM sizes nothing from this
    share; it only refuses to start unless share x the device's total memory is free
    (vllm/v1/worker/utils.py::request_memory, 0.26-0.34). A fixed 0.92 kept a second replica, or any
    card shared with another engine, from starting; the plan's own bytes let every engine the plan
    fits on the card start. What vLLM holds beyond them (activations at the token budget, CUDA
    graphs, its context) is not in forge's plan, so the share is a floor, not a cap."""
    share = (plan.weights_bytes + plan.kv_pool_bytes) / plan.card_memory_bytes
    return min(1.0, max(0.001, math.ceil(share * 1000) / 1000))


def engine_arguments(contract: Contract, plan: CardPlan) -> dict[str, Any]:
    """vLLM's EngineArgs for one engine of this plan, every value stated. Raises ConfigError where
    the contract cannot be mapped (the same problems `forge validate` reports)."""
    found = problems(contract)
    if found:
        raise ConfigError(found)
    return unchecked_arguments(contract, plan)


def unchecked_arguments(contract: Contract, plan: CardPlan) -> dict[str, Any]:
    """engine_arguments() without forge's checks: what an engine would be given
    (scripts/check_vllm_wheel.py asks a vLLM release about contracts forge refuses)."""
    sec = section(contract)
    lim, kv, prec, art = contract.limits, contract.kv_cache, contract.precision, contract.artifact
    checkpoint = str(contract.resolve(art.checkpoint))
    host_bytes = kv.host_cache_bytes
    return {
        "model": checkpoint,
        "tokenizer": str(contract.resolve(art.tokenizer or art.checkpoint)),
        "load_format": "dummy" if art.random_weights else "auto",
        "dtype": WEIGHT_DTYPES[prec.weights],
        "kv_cache_dtype": kv_cache_dtype(contract),
        "seed": sec.seed,
        "max_model_len": lim.max_input_len + lim.max_output_len,
        "max_num_batched_tokens": lim.max_num_tokens,
        "max_num_seqs": lim.max_batch_size,
        "block_size": kv.tokens_per_block,
        "kv_cache_memory_bytes": plan.num_blocks * kv.tokens_per_block * plan.bytes_per_token,
        "num_gpu_blocks_override": plan.num_blocks,
        "gpu_memory_utilization": gpu_memory_utilization(plan),
        "kv_offloading_size": host_bytes / GIB if host_bytes else None,
        "kv_offloading_backend": sec.kv_offloading_backend,
        "enable_prefix_caching": kv.block_reuse,
        "enable_chunked_prefill": sec.chunked_prefill,
        "long_prefill_token_threshold": sec.long_prefill_token_threshold,
        "scheduler_reserve_full_isl": True,
        "async_scheduling": sec.async_scheduling,
        # forge keeps a queue inside vLLM (docs/admission.md, "An engine's own queue"): its waiting
        # requests are ordered by the broker's priority, so an online request takes the next free
        # slot ahead of queued bulk work. vLLM preempts for priority only when a running request
        # cannot get a block, which forge's KV reservation rules out.
        "scheduling_policy": "priority",
        "enforce_eager": sec.enforce_eager,
        "attention_backend": sec.attention_backend,
        # guided JSON without free whitespace between tokens: a small model otherwise fills its
        # budget with blanks (vLLM refuses the setting with outlines and lm-format-enforcer, which
        # keep their own whitespace rules)
        "structured_outputs_config": {
            "backend": sec.structured_outputs_backend,
            "disable_any_whitespace": sec.structured_outputs_backend in rules.COMPACT_JSON_BACKENDS,
        },
        "stream_interval": sec.stream_interval,
        "generation_config": "vllm",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "distributed_executor_backend": "uni",
        "disable_log_stats": False,
    }


def environment() -> dict[str, Optional[str]]:
    """Environment variables to set (a value) or clear (None) before vLLM is imported in the card
    worker."""
    return {**ENV_SET, **{name: None for name in ENV_CLEAR}}


def apply_environment(env: dict) -> dict[str, Optional[str]]:
    """Set and clear environment() in `env` (os.environ in the worker); returns what was there
    before."""
    before = {}
    for name, value in environment().items():
        before[name] = env.get(name)
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return before


# What the card worker reads back from the engine vLLM built, and refuses the card on where it
# differs: (contract field, engine argument, attribute of vLLM's VllmConfig holding what it built).
READ_BACK = (
    ("limits.max_num_tokens", "max_num_batched_tokens", "scheduler_config.max_num_batched_tokens"),
    ("limits.max_batch_size", "max_num_seqs", "scheduler_config.max_num_seqs"),
    ("limits.max_input_len + max_output_len", "max_model_len", "model_config.max_model_len"),
    ("kv_cache.tokens_per_block", "block_size", "cache_config.block_size"),
    ("kv_cache", "num_gpu_blocks_override", "cache_config.num_gpu_blocks"),
    ("kv_cache.block_reuse", "enable_prefix_caching", "cache_config.enable_prefix_caching"),
    ("vllm.chunked_prefill", "enable_chunked_prefill", "scheduler_config.enable_chunked_prefill"),
    ("vllm.async_scheduling", "async_scheduling", "scheduler_config.async_scheduling"),
    ("vllm.enforce_eager", "enforce_eager", "model_config.enforce_eager"),
)


def read_back_problems(contract: Contract, plan: CardPlan, built: dict[str, Any]) -> list[Problem]:
    """One Problem per value vLLM built differently from what the contract asked (`built`: engine
    argument -> the value read back from vLLM's config), naming the contract field, its value and
    the engine's."""
    asked = engine_arguments(contract, plan)
    out = []
    for field_name, argument, attribute in READ_BACK:
        if argument not in built or built[argument] == asked[argument]:
            continue
        if argument == "num_gpu_blocks_override":
            kv = contract.kv_cache
            path = (
                "$.kv_cache.max_tokens"
                if kv.max_tokens is not None
                else "$.kv_cache.free_gpu_memory_fraction"
            )
            contract_says = (f"{plan.num_blocks} blocks of {kv.tokens_per_block} tokens "
                             f"({plan.kv_pool_tokens} tokens)")
        else:
            path = "$." + field_name.split(" ")[0]
            contract_says = repr(asked[argument])
        out.append(Problem(where(contract), path, f"contract {contract_says}, vLLM built "
                                                  f"{built[argument]!r} "
                           f"({attribute}); the card is refused"))
    return out
