"""KV-cache arithmetic: bytes per token, pool size, blocks and full-length slots. Pure functions."""
from __future__ import annotations

from fractions import Fraction

from forge.config.units import GIB

KV_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str, tp_size: int = 1
) -> int:
    """K and V for every layer of one token: 2 x layers x kv_heads x head_dim x dtype bytes / TP."""
    return 2 * num_layers * num_kv_heads * head_dim * KV_DTYPE_BYTES[kv_dtype] // max(tp_size, 1)


def blocks_for(tokens: int, tokens_per_block: int) -> int:
    """Blocks needed to hold `tokens` tokens (rounded up)."""
    return -(-tokens // tokens_per_block)  # integer ceil: exact for any size (no float overflow)


def pool_tokens(
    *,
    card_memory_bytes: int,
    weights_bytes: int,
    bytes_per_token: int,
    tokens_per_block: int,
    free_gpu_memory_fraction: float | None,
    max_tokens: int | None,
    replicas: int = 1,
) -> int:
    """Tokens the KV pool of ONE engine holds, rounded down to whole blocks.

    max_tokens is taken as stated (per engine). A fraction applies to the memory left after the
    weights (as TensorRT-LLM applies it to free memory after loading); with N replicas on the card,
    to the memory left after N copies of the weights, shared equally by the N engines. Activation
    buffers are not modelled."""
    if max_tokens is not None:
        tokens = max_tokens
    else:
        free = max(card_memory_bytes - replicas * weights_bytes, 0) // max(replicas, 1)
        try:
            tokens = int(free * float(free_gpu_memory_fraction or 0.0)) // bytes_per_token
        except OverflowError:           # a memory size beyond floats: exact arithmetic instead
            tokens = int(free * Fraction(free_gpu_memory_fraction or 0.0)) // bytes_per_token
    return (tokens // tokens_per_block) * tokens_per_block


def gib(n: float) -> int:
    try:
        return int(n * GIB)
    except OverflowError:               # e.g. 1e308 GiB: the product is not a float any more
        return int(Fraction(n) * GIB)
