"""Validation rules: transformers' attention must have room for its working memory on the card.

Two tensors a tier's geometry alone decides, both beside the weights and the KV pool the plan
already counts:

- The attention mask (`attention_masks_fit`). Every attention implementation but flash reads a
  step's queries against the whole paged cache through an explicit mask of max_num_tokens x
  (readable KV tokens + max_num_tokens) elements in the model's dtype, one per step buffer (two with
  async batching), allocated when the engine is built (transformers 5.24:
  PagedAttentionMemoryHandler.attention_mask_bytes, part of the footprint it checks at load).
  Readable KV tokens are at least the pool, so the mask computed on the pool is a lower bound of
  what transformers allocates (on the embedded tier, exactly its size:
  tests/engines/test_transformers_backend.py): a tier refused here is one transformers would refuse
  at load (or, where it sees more memory than the card has, one that would not fit the card). Found
  on a CPU tier with the H200 1.5B tier's geometry (budget 8,192, a 294,912-token pool, fp32): a 9.3
  GiB mask that the plan's "143.68 MiB of 3.00 GiB" never showed.
- Eager attention's scores (`eager_scores_fit`). `attn_implementation: eager` runs transformers'
  `eager_paged_attention_forward`, which materialises the softmax of every head's scores in fp32:
  heads x the step's query tokens x the KV tokens the step reads x 4 bytes, for one layer at a time.
  A step reads the KV of every request it runs, so the worst case is the token budget against a
  pool's worth of KV (or the slots at full length, if fewer). On one H200 the 1.5B tier (32 heads,
  budget 8,192, a 294,912-token pool) died at its first large step asking for 49.75 GiB
  (docs/benchmarks.md, "Engine tiers"). sdpa and flash never hold the scores of a whole step. Reads
  the checkpoint's config.json for the number of query heads (the contract names only the KV heads);
  a config it cannot read is left to the checkpoint checks."""
from __future__ import annotations

from typing import Any, Iterator, Optional

from forge.config.checkpoint_dir import geometry
from forge.config.files import FileRefused, read_json, shown
from forge.config.kvmath import KV_DTYPE_BYTES
from forge.config.models import Contract
from forge.config.plan import CardPlan
from forge.config.units import fmt_bytes
from forge.engines.transformers.sizing import FLASH, PRECISION_TO_DTYPE, dtype_of, section_of
from forge.engines.transformers.section import BACKEND
from forge.errors import ForgeError, Problem

SCORE_BYTES = 4                          # the softmax runs in float32 whatever the model's dtype
# torch dtype -> bytes
DTYPE_BYTES = {dtype: KV_DTYPE_BYTES[prec] for prec, dtype in PRECISION_TO_DTYPE.items()}


def query_heads(contract: Contract) -> Optional[int]:
    ckpt = contract.resolve(contract.artifact.checkpoint)
    if ckpt is None:
        return None
    try:
        cfg = read_json(ckpt / "config.json")
    except (FileRefused, OSError):
        return None
    heads = geometry(cfg)["num_attention_heads"]
    return heads if isinstance(heads, int) and heads > 0 else None


def kv_read_tokens(plan: CardPlan) -> int:
    """The most KV tokens one step can read: the pool, or every slot at full length if that is
    less."""
    lim = plan.contract.limits
    return min(plan.kv_pool_tokens, lim.max_batch_size * (lim.max_input_len + lim.max_output_len))


def eager_scores_bytes(plan: CardPlan, heads: int) -> int:
    """The largest fp32 score tensor one layer of one step can need on this plan's engine."""
    return heads * plan.contract.limits.max_num_tokens * kv_read_tokens(plan) * SCORE_BYTES


def mask_bytes(plan: CardPlan, section) -> int:
    """The attention masks one engine of this plan allocates at least (0 with flash attention):
    max_num_tokens x (pool + max_num_tokens) elements of the model's dtype, per step buffer (two
    with async batching)."""
    # flash reads the paged cache through block tables, no mask
    if section.attn_implementation in FLASH:
        return 0
    m = plan.contract.limits.max_num_tokens
    buffers = 2 if section.async_batching else 1
    return buffers * DTYPE_BYTES[dtype_of(plan, section)] * m * (plan.kv_pool_tokens + m)


def working_memory(plan: CardPlan) -> list[tuple[str, int]]:
    """What one engine of the plan allocates beside weights and pool that the contract decides: its
    attention masks (the transformers Backend's working_memory; shown in the plan)."""
    try:
        return [("attention mask", mask_bytes(plan, section_of(plan)))]
    except ForgeError:  # a section or dtype the contract rules refuse (reported there)
        return []


def _transformers_cards(loaded) -> Iterator[tuple[str, str, CardPlan, Any, int]]:
    """(file, path, card plan, section, the card's attention masks) for every card a transformers
    tier fits (weights and pools; the rule that refuses those is forge's own) whose section and
    dtype the contract rules accept."""
    for name, plans in loaded.plans.items():
        node = loaded.nodes.get(name)
        file = shown(node.source) if node is not None and node.source else f"<node {name}>"
        index = {id(card): i for i, card in enumerate(node.cards)} if node is not None else {}
        for p in plans:
            if p.contract.backend != BACKEND or not p.fits_memory:
                continue
            try:
                section = section_of(p)
                masks = p.replicas * mask_bytes(p, section)     # each replica builds its own
            except ForgeError:             # reported by the contract rules
                continue
            yield file, f"$.cards[{index.get(id(p.card), '?')}].engine", p, section, masks


def attention_masks_fit(loaded) -> list[Problem]:
    """Every card whose transformers tier builds attention masks, checked for room beside weights
    and pools."""
    out = []
    for file, path, p, section, masks in _transformers_cards(loaded):
        room = p.card_memory_bytes - p.card_bytes
        if masks > room:
            m, pool = p.contract.limits.max_num_tokens, p.kv_pool_tokens
            each = f"{p.replicas} replicas x " if p.replicas > 1 else ""
            buffers = " x 2 step buffers (async batching)" if section.async_batching else ""
            out.append(Problem(
                file, path,
                f"{p.contract.contract} builds {section.attn_implementation} attention masks of "
                f"{fmt_bytes(masks)} "
                f"({each}max_num_tokens {m} x (KV pool {pool} + {m}) tokens x "
                f"{DTYPE_BYTES[dtype_of(p, section)]} "
                f"bytes{buffers}); the card has {fmt_bytes(room)} beside weights and KV pool: use "
                "a smaller "
                f"max_num_tokens or pool, or flash attention on a GPU"))
    return out


def eager_scores_fit(loaded) -> list[Problem]:
    """Every GPU card whose transformers tier runs eager attention, checked for room beside weights,
    pools and attention masks (where the masks fit: attention_masks_fit reports those that do
    not)."""
    out = []
    for file, path, p, section, masks in _transformers_cards(loaded):
        if p.card.kind != "gpu" or section.attn_implementation != "eager":
            continue
        room = p.card_memory_bytes - p.card_bytes - masks
        heads = query_heads(p.contract)
        if heads is None or room < 0:
            continue
        need = eager_scores_bytes(p, heads)
        if need > room:
            out.append(Problem(
                file, path,
                f"{p.contract.contract} runs eager attention, whose fp32 scores need up to "
                f"{fmt_bytes(need)} in "
                f"one layer's step ({heads} heads x max_num_tokens "
                f"{p.contract.limits.max_num_tokens} x "
                f"{kv_read_tokens(p)} KV tokens x 4 bytes); the card has {fmt_bytes(room)} beside "
                "weights, KV "
                f"pool and attention masks: use sdpa, or a smaller max_num_tokens or pool"))
    return out
