"""Contract + release -> the exact keyword arguments of tensorrt_llm.LLM on the PyTorch path
(TorchLlmArgs, nested KvCacheConfig / SchedulerConfig / CudaGraphConfig as dicts), with every
default that shapes the engine stated. Pure: never imports tensorrt_llm; what the installed release
offers comes in as a Release.

A field newer than the installed release is passed only where the release has it (its
`model_fields`); where it has not, the argument is left out and recorded in `not_passed` with the
reason, or, when leaving it out would change what the contract states, the card is refused in one
line naming the contract field."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from forge.config.models import Contract
from forge.engines.trtllm.release import Release, ships_executor
from forge.engines.trtllm.section import SECTION, TrtllmSection
from forge.errors import EngineUnavailable

ITER_STATS_MAX_ITERATIONS = 128          # stats kept between two stats() calls (bounded memory)
GUIDED_DECODING_BACKEND = "xgrammar"
# With `max_tokens` TensorRT-LLM still caps the pool by the fraction (the smaller wins; unset means
# 0.9): stated here instead of inherited, with the same value.
MAX_TOKENS_MEMORY_CAP = 0.9
_WEIGHT_DTYPE = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "auto",
    "int4": "auto",
}


def torch_kv_dtype(contract: Contract) -> Optional[str]:
    """KvCacheConfig.dtype: 'fp8', or 'auto' (= the model dtype, the checkpoint declaring no KV
    quantization: validation checks that) when that is what the contract states; None when the
    PyTorch path cannot store it."""
    kv, weights = contract.precision.kv_cache, contract.precision.weights
    if kv == "fp8":
        return "fp8"
    if kv == weights or (weights in ("fp8", "int4") and kv in ("bf16", "fp16")):
        return "auto"
    return None


def cuda_graph_batch_sizes(slots: int) -> list[int]:
    """Decode batch sizes to capture: powers of two below the slots, and the slots themselves. With
    padding every decode-only batch up to the contract's slots replays a graph (TensorRT-LLM's
    default stops at 128)."""
    sizes, n = [], 1
    while n < slots:
        sizes.append(n)
        n *= 2
    return sizes + [slots]


def kv_sizing(contract: Contract) -> dict[str, Any]:
    kv = contract.kv_cache
    if kv.max_tokens is not None:
        return {"max_tokens": kv.max_tokens, "free_gpu_memory_fraction": MAX_TOKENS_MEMORY_CAP}
    return {"max_tokens": None, "free_gpu_memory_fraction": kv.free_gpu_memory_fraction}


class _Builder:
    """Collects arguments, passing a field only where the release has it."""

    def __init__(self, contract: Contract, release: Release, where: str):
        self.contract, self.release, self.where = contract, release, where
        self.not_passed: dict[str, str] = {}

    def lacks(self, model: str, field: str) -> bool:
        return not self.release.has(model, field)

    def refuse(self, path: str, model: str, field: str, why: str) -> EngineUnavailable:
        return EngineUnavailable(f"{self.where}::{path}: TensorRT-LLM {self.release.version} has "
                                 "no "
                                 f"{model}.{field}, so {why}")

    def require(self, model: str, field: str, path: str, why: str) -> None:
        if self.lacks(model, field):
            raise self.refuse(path, model, field, why)

    def optional(
        self, out: dict, model: str, field: str, value: Any, reason_absent: str, name: str = ""
    ) -> None:
        if self.lacks(model, field):
            self.not_passed[name or field] = (f"TensorRT-LLM {self.release.version} has no "
                                              f"{model}.{field}: "
                                              f"{reason_absent}")
        else:
            out[field] = value


def llm_api_arguments(
    contract: Contract,
    release: Release,
    checkpoint: Path,
    tokenizer: Path,
    *,
    capacity_scheduler_policy: str,
    where: str,
) -> tuple[dict[str, Any], dict[str, str]]:
    """(kwargs for tensorrt_llm.LLM, {argument left out: why}). Raises EngineUnavailable in one line
    where the release cannot honour what the contract states."""
    section = contract.sections.get(SECTION)
    if not isinstance(section, TrtllmSection):
        raise EngineUnavailable(f"{where}::$.{SECTION}: a trtllm checkpoint contract must state "
                                f"its {SECTION}: "
                                "section (prefix_aware_scheduling, overlap_scheduler, "
                                "stream_interval)")
    lim, kv = contract.limits, contract.kv_cache
    b = _Builder(contract, release, where)
    for field, path in (
        ("dtype", "$.precision.kv_cache"),
        ("tokens_per_block", "$.kv_cache.tokens_per_block"),
    ):
        b.require("KvCacheConfig", field, path,
                  "forge cannot state the contract's KV cache (older releases kept the KV dtype "
                  "elsewhere)")
    b.require("TorchLlmArgs", "enable_iter_perf_stats", "$.artifact.checkpoint",
              "get_stats() would return nothing and forge could not watch the pool")
    kv_config: dict[str, Any] = {
        "tokens_per_block": kv.tokens_per_block,
        "dtype": torch_kv_dtype(contract) or "auto",
        "enable_block_reuse": kv.block_reuse,
        **kv_sizing(contract),
        "host_cache_size": kv.host_cache_bytes,
    }
    # Manager V2 ("auto" lets the model choose it) ignores max_tokens; V1 builds the pool the plan
    # counted.
    b.optional(
        kv_config,
        "KvCacheConfig",
        "use_kv_cache_manager_v2",
        False,
        "the release has only the V1 KV-cache manager",
        "kv_cache_config.use_kv_cache_manager_v2",
    )
    scheduler: dict[str, Any] = {"capacity_scheduler_policy": capacity_scheduler_policy}
    if b.lacks("SchedulerConfig", "enable_prefix_aware_scheduling"):
        # Prefix-aware scheduling came to main with NVIDIA/TensorRT-LLM#11637 (2026-02), after the
        # 1.2 branch; its switch with #15526 (2026-06). A 1.2.x release schedules without it; a
        # later one without the switch may or may not have it, so there forge cannot state either
        # value.
        if not ships_executor(release.version) or section.prefix_aware_scheduling:
            raise b.refuse(
                f"$.{SECTION}.prefix_aware_scheduling",
                "SchedulerConfig",
                "enable_prefix_aware_scheduling",
                "forge cannot state prefix-aware scheduling (1.2.x releases have none: "
                "prefix_aware_scheduling: false; later ones need the switch)",
            )
        b.not_passed["scheduler_config.enable_prefix_aware_scheduling"] = (
            f"TensorRT-LLM {release.version} has no "
            "SchedulerConfig.enable_prefix_aware_scheduling: a 1.2.x release "
            "never schedules prefix-aware, as the contract states")
    else:
        scheduler["enable_prefix_aware_scheduling"] = section.prefix_aware_scheduling
    args: dict[str, Any] = {
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
        # max_num_tokens >= max_input_len (validated): a prompt fits a step
        "enable_chunked_prefill": False,
        "enable_iter_perf_stats": True,  # off by default: get_stats() would return nothing
        "iter_stats_max_iterations": ITER_STATS_MAX_ITERATIONS,
        "guided_decoding_backend": GUIDED_DECODING_BACKEND,
        "scheduler_config": scheduler,
        "kv_cache_config": kv_config,
    }
    # The PyTorch path bounds its stats list by max_stats_len (default 1000), not
    # iter_stats_max_iterations.
    b.optional(args, "TorchLlmArgs", "max_stats_len", ITER_STATS_MAX_ITERATIONS,
               "the stats list is bounded by iter_stats_max_iterations alone")
    b.require("TorchLlmArgs", "disable_overlap_scheduler", f"$.{SECTION}.overlap_scheduler",
              "forge cannot state the overlap scheduler the contract names")
    args["disable_overlap_scheduler"] = not section.overlap_scheduler
    b.require("TorchLlmArgs", "stream_interval", f"$.{SECTION}.stream_interval",
              "forge cannot state the stream interval the contract names")
    args["stream_interval"] = section.stream_interval
    graphs = {
        "batch_sizes": cuda_graph_batch_sizes(lim.max_batch_size),
        "max_batch_size": lim.max_batch_size,
        "enable_padding": True,
    }
    for field in graphs:
        b.require("CudaGraphConfig", field, "$.limits.max_batch_size",
                  "forge cannot state CUDA-graph batch sizes up to the contract's slots")
    b.require("TorchLlmArgs", "cuda_graph_config", "$.limits.max_batch_size",
              "forge cannot state CUDA-graph batch sizes up to the contract's slots")
    args["cuda_graph_config"] = graphs
    return args, b.not_passed
