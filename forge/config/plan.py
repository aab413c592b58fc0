"""The provisioning plan: per card, what its engine will hold. Computed before any engine loads."""
from __future__ import annotations

from dataclasses import dataclass

from forge.config import kvmath
from forge.config.models import Card, Contract


@dataclass(frozen=True)
class CardPlan:
    card: Card
    contract: Contract
    weights_bytes: int
    bytes_per_token: int
    kv_pool_tokens: int          # whole blocks only
    kv_pool_bytes: int
    num_blocks: int
    blocks_per_full_seq: int     # ceil((max_input_len + max_output_len) / tokens_per_block)
    full_length_slots: int       # full-length sequences the pool holds at once
    card_memory_bytes: int

    @property
    def token_budget(self) -> int:
        return self.contract.limits.max_num_tokens

    @property
    def slots(self) -> int:
        return self.contract.limits.max_batch_size

    @property
    def effective_slots(self) -> int:
        """Sequences that can really be in flight at full length: min(slots, what the pool holds)."""
        return min(self.slots, self.full_length_slots)

    @property
    def fits_memory(self) -> bool:
        return self.weights_bytes + self.kv_pool_bytes <= self.card_memory_bytes

    @property
    def card_id(self) -> str:
        return f"{self.card.kind}{self.card.index}"


def plan_card(card: Card, contract: Contract) -> CardPlan:
    m, kv, lim = contract.model, contract.kv_cache, contract.limits
    bpt = kvmath.kv_bytes_per_token(m.num_layers, m.num_kv_heads, m.head_dim, contract.precision.kv_cache)
    weights = kvmath.gib(m.weights_gib)
    card_mem = kvmath.gib(card.memory_gib)
    tokens = kvmath.pool_tokens(card_memory_bytes=card_mem, weights_bytes=weights, bytes_per_token=bpt,
                                tokens_per_block=kv.tokens_per_block,
                                free_gpu_memory_fraction=kv.free_gpu_memory_fraction, max_tokens=kv.max_tokens)
    blocks = tokens // kv.tokens_per_block
    per_seq = kvmath.blocks_for(lim.max_input_len + lim.max_output_len, kv.tokens_per_block)
    return CardPlan(card=card, contract=contract, weights_bytes=weights, bytes_per_token=bpt,
                    kv_pool_tokens=tokens, kv_pool_bytes=tokens * bpt, num_blocks=blocks,
                    blocks_per_full_seq=per_seq, full_length_slots=blocks // per_seq, card_memory_bytes=card_mem)


def plan_node(node, contracts: dict[str, Contract]) -> list[CardPlan]:
    """One CardPlan per card, in the node's card order; every card's contract must be given."""
    from forge.errors import ForgeError

    missing = sorted({card.engine for card in node.cards if card.engine not in contracts})
    if missing:
        raise ForgeError(f"node {node.node}: no contract named {', '.join(missing)}")
    return [plan_card(card, contracts[card.engine]) for card in node.cards]
