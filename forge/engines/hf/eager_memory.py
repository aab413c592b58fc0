"""A validation rule: transformers' eager attention must have room for its scores on the card.

`attn_implementation: eager` runs transformers' `eager_paged_attention_forward`, which materialises the softmax
of every head's scores in fp32: heads x the step's query tokens x the KV tokens the step reads x 4 bytes, for one
layer at a time, on top of the weights and the KV pool. A step reads the KV of every request it runs, so the
worst case is the token budget against a pool's worth of KV (or the slots at full length, if fewer). On one
H200 the 1.5B tier (32 heads, budget 8,192, a 294,912-token pool) died at its first large step asking for
49.75 GiB (docs/benchmarks.md, call B); this rule refuses such a tier before any engine loads. sdpa and flash
never hold the scores of a whole step. Reads the checkpoint's config.json for the number of query heads (the
contract names only the KV heads); a config it cannot read is left to the checkpoint checks."""
from __future__ import annotations

from typing import Optional

from forge.config.checkpoint_dir import geometry
from forge.config.files import FileRefused, read_json, shown
from forge.config.models import Contract
from forge.config.plan import CardPlan
from forge.config.units import fmt_bytes
from forge.errors import Problem

BACKEND = "transformers"
SCORE_BYTES = 4                          # the softmax runs in float32 whatever the model's dtype


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
    """The most KV tokens one step can read: the pool, or every slot at full length if that is less."""
    lim = plan.contract.limits
    return min(plan.kv_pool_tokens, lim.max_batch_size * (lim.max_input_len + lim.max_output_len))


def eager_scores_bytes(plan: CardPlan, heads: int) -> int:
    """The largest fp32 score tensor one layer of one step can need on this plan's engine."""
    return heads * plan.contract.limits.max_num_tokens * kv_read_tokens(plan) * SCORE_BYTES


def eager_scores_fit(loaded) -> list[Problem]:
    """Every GPU card whose transformers tier runs eager attention, checked for room beside weights and pools."""
    out = []
    for name, plans in loaded.plans.items():
        node = loaded.nodes.get(name)
        file = shown(node.source) if node is not None and node.source else f"<node {name}>"
        index = {id(card): i for i, card in enumerate(node.cards)} if node is not None else {}
        for p in plans:
            section = p.contract.sections.get(BACKEND)
            if (p.contract.backend != BACKEND or section is None or p.card.kind != "gpu"
                    or getattr(section, "attn_implementation", None) != "eager" or not p.fits_memory):
                continue
            heads = query_heads(p.contract)
            if heads is None:
                continue
            need, room = eager_scores_bytes(p, heads), p.card_memory_bytes - p.card_bytes
            if need > room:
                out.append(Problem(
                    file, f"$.cards[{index.get(id(p.card), '?')}].engine",
                    f"{p.contract.contract} runs eager attention, whose fp32 scores need up to {fmt_bytes(need)} in "
                    f"one layer's step ({heads} heads x max_num_tokens {p.contract.limits.max_num_tokens} x "
                    f"{kv_read_tokens(p)} KV tokens x 4 bytes); the card has {fmt_bytes(room)} beside weights and "
                    f"KV pool: use sdpa, or a smaller max_num_tokens or pool"))
    return out
