"""From a contract and its card plan to transformers' settings: section, device, dtype and the exact
ContinuousBatchingConfig. Pure functions (no torch), so the mapping is tested without an engine."""
from __future__ import annotations

from typing import Any

from forge.config.plan import CardPlan
from forge.config.units import GIB
from forge.engines.transformers.section import BACKEND, TransformersSection
from forge.errors import ForgeError

# contract precision -> torch dtype name; fp8 / int4 weights are not something this backend can
# load.
PRECISION_TO_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
FLASH = ("flash_attention_2", "flash_attention_3")


def where(plan: CardPlan) -> str:
    """How errors name the contract: its file when known, else its name."""
    src = plan.contract.source
    return str(src) if src else f"contract {plan.contract.contract}"


def section_of(plan: CardPlan) -> TransformersSection:
    """The contract's `transformers:` section (already validated by the loader, or raw), or all
    defaults."""
    raw = plan.contract.sections.get(BACKEND)
    if raw is None:
        return TransformersSection()
    if isinstance(raw, TransformersSection):
        return raw
    try:
        return TransformersSection.model_validate(raw)
    except Exception as exc:  # pydantic's message, flattened onto one line
        raise ForgeError(f"{where(plan)}::$.{BACKEND}: {' '.join(str(exc).split())}") from None


def device_of(plan: CardPlan) -> str:
    """A cpu card runs on "cpu"; gpu card index i on "cuda:i"."""
    return "cpu" if plan.card.kind == "cpu" else f"cuda:{plan.card.index}"


def dtype_of(plan: CardPlan, section: TransformersSection) -> str:
    """The model dtype. transformers stores the KV cache in the model's dtype, so kv_cache must
    agree with it."""
    prec = plan.contract.precision
    if section.dtype is not None:
        dtype = section.dtype
    elif prec.weights in PRECISION_TO_DTYPE:
        dtype = PRECISION_TO_DTYPE[prec.weights]
    else:
        raise ForgeError(f"{where(plan)}::$.precision.weights: the transformers backend runs fp32, "
                         "bf16 or fp16 "
                         f"weights, not {prec.weights}")
    if PRECISION_TO_DTYPE.get(prec.kv_cache) != dtype:
        raise ForgeError(f"{where(plan)}::$.precision.kv_cache: the transformers backend keeps the "
                         "KV cache in the "
                         f"model dtype ({dtype}); {prec.kv_cache} cannot be honoured")
    return dtype


def capacity_of(plan: CardPlan, section: TransformersSection) -> int:
    """Requests the engine holds at once (running + waiting); submit beyond this raises
    EngineBusy."""
    slots = plan.contract.limits.max_batch_size
    return slots + (section.max_waiting if section.max_waiting is not None else slots)


def cb_config_kwargs(plan: CardPlan, section: TransformersSection) -> dict[str, Any]:
    """Every ContinuousBatchingConfig field that sizes or shapes the engine, from the contract; none
    left to transformers' inference from free memory.

    The KV pool is always given as num_blocks = the plan's block count (max_tokens /
    tokens_per_block, or the plan's share of card memory for free_gpu_memory_fraction), so the
    engine holds exactly the pool the plan printed. max_memory_percent then only bounds
    transformers' own footprint check: the contract's fraction when it gives one, else 1.0 (the pool
    was sized by the contract and checked against the card by validation)."""
    c = plan.contract
    kv, lim = c.kv_cache, c.limits
    flash = section.attn_implementation in FLASH
    return dict(
        max_batch_tokens=lim.max_num_tokens,
        max_requests_per_batch=lim.max_batch_size,
        page_size=kv.tokens_per_block,
        num_blocks=plan.num_blocks,
        max_memory_percent=kv.free_gpu_memory_fraction
        if kv.free_gpu_memory_fraction is not None
        else 1.0,
        allow_block_sharing=kv.block_reuse,
        cpu_offload_space=kv.host_cache_bytes / GIB,
        cpu_offload_space_safety_threshold=1.0,  # no silent clamp: validation checks host memory
        # The block table of the decode fast path needs flash_attn_with_kvcache; size it for a
        # full-length sequence.
        max_blocks_per_request=plan.blocks_per_full_seq if flash else 0,
        scheduler_type=section.scheduler,
        safety_margin=section.safety_margin,
        use_cuda_graph=section.use_cuda_graph,
        use_async_batching=section.async_batching,
        default_compile_level=section.compile_level,
        # Query padding (graphs or compile only) as the contract states it. transformers reads a
        # non-zero padding as "graphs wanted" only when use_cuda_graph is None, and it is always
        # given above. KV read keeps its preset (16,384; 0 here): coarser KV padding grows every
        # step's attention.
        q_padding_interval_size=section.graph_q_padding,
        kv_padding_interval_size=0,
        return_logprobs=False,
        seed=section.seed,
        auto_switch_to_flash=False,
        max_queue_size=capacity_of(plan, section),
        per_request_processors=section.sampling == "per_request",
        drop_unsupported_processors=True,
    )
