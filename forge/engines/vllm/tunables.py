"""The vllm backend's switches for `forge bench sweep` (its Backend's `tunables`): no vLLM import
here.

In the order a sweep tries them: chunked prefill and its chunk cap (how prefill shares a step with
decodes), the KV block size (a contract field: vLLM's CPU attention takes multiples of 32), the
attention backend and async scheduling where the card has more than one (a CPU card has CPU_ATTN and
no async scheduling: listed, with why), then torch.compile (enforce_eager false: minutes on the
first load, so the sweep tries it last, candidates.SLOW). The token budget and the slots are the
sweep's own dimensions (½ and 2 x the contract's)."""
from __future__ import annotations

from forge.tunables import Choice, Tunable

BACKEND = "vllm"
GPU_ATTENTION = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
CPU_BLOCK_MULTIPLE = 32           # vLLM's CPU_ATTN kernel: block sizes that are a multiple of 32
BLOCK_SIZES = (16, 32, 64, 128)


def vllm_tunables(contract, card) -> list[Tunable]:
    cpu = card.kind == "cpu"
    budget = contract.limits.max_num_tokens
    thresholds = sorted({0, max(1, budget // 4), max(1, budget // 2)})
    return [
        Tunable(
            f"{BACKEND}.chunked_prefill",
            (Choice(True), Choice(False)),
            note="false: a whole prompt in one step (needs max_num_tokens >= max_input_len + "
            "max_output_len)",
        ),
        Tunable(
            f"{BACKEND}.long_prefill_token_threshold",
            tuple(Choice(v) for v in thresholds),
            note="the largest prompt chunk of a step (0: up to the whole budget), so decodes "
            "keep their share",
        ),
        Tunable(
            "kv_cache.tokens_per_block",
            tuple(
                Choice(
                    v,
                    unavailable=(
                        "vLLM's CPU attention takes block sizes that are a "
                        "multiple of "
                        f"{CPU_BLOCK_MULTIPLE}"
                    )
                    if cpu and v % CPU_BLOCK_MULTIPLE
                    else None,
                )
                for v in BLOCK_SIZES
            ),
            note="vLLM's block_size: the unit of KV allocation and of prefix reuse",
        ),
        Tunable(
            f"{BACKEND}.attention_backend",
            (
                Choice("CPU_ATTN", unavailable=None if cpu else "runs on vLLM's CPU platform only"),
                *(
                    Choice(b, unavailable="vLLM's CPU platform runs CPU_ATTN only" if cpu else None)
                    for b in GPU_ATTENTION
                ),
            ),
        ),
        Tunable(
            f"{BACKEND}.async_scheduling",
            (
                Choice(False),
                Choice(True, unavailable="vLLM's CPU platform turns it off" if cpu else None),
            ),
            note="schedule step N+1 while step N runs",
        ),
        Tunable(
            f"{BACKEND}.enforce_eager",
            (Choice(True), Choice(False)),
            note="false: torch.compile (and CUDA graphs on GPUs); the first load compiles for "
            "minutes",
        ),
    ]
