"""The provisioning plan: per card, what its engine(s) will hold. Computed before any engine loads.

A card may run its contract N times (`cards[].replicas`): N engine processes, each with its own copy
of the weights and its own KV pool. `plan_card` gives the card's plan (what validation and
`provision --dry-run` read: per-replica figures, the card's total); `replica_plans` / `engine_plans`
give one plan per engine, which is what a runtime starts (one engine worker per replica) and what
the broker sees (one engine each)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional

from forge.config import kvmath
from forge.config.models import Card, Contract

@dataclass(frozen=True)
class CardPlan:
    card: Card
    contract: Contract
    weights_bytes: int           # one engine's
    bytes_per_token: int
    kv_pool_tokens: int          # one engine's pool, whole blocks only
    kv_pool_bytes: int
    num_blocks: int
    blocks_per_full_seq: int     # ceil((max_input_len + max_output_len) / tokens_per_block)
    full_length_slots: int       # full-length sequences one engine's pool holds at once
    card_memory_bytes: int
    replicas: int = 1            # engines of this contract on the card (cards[].replicas)
    # which one this plan is (0..replicas-1); None: the card's plan, all replicas
    replica: Optional[int] = None

    @property
    def token_budget(self) -> int:
        return self.contract.limits.max_num_tokens

    @property
    def slots(self) -> int:
        return self.contract.limits.max_batch_size

    @property
    def effective_slots(self) -> int:
        """Sequences that can really be in flight at full length: min(slots, what the pool
        holds)."""
        return min(self.slots, self.full_length_slots)

    @property
    def card_bytes(self) -> int:
        """What every engine of this card holds together: replicas x (weights + KV pool)."""
        return self.replicas * (self.weights_bytes + self.kv_pool_bytes)

    @property
    def fits_memory(self) -> bool:
        return self.card_bytes <= self.card_memory_bytes

    @property
    def card_id(self) -> str:
        return f"{self.card.kind}{self.card.index}"

    @property
    def engine_id(self) -> str:
        """The engine's name on the node: the card id for a card's only engine, `gpu0.r1` for its
        replica 1."""
        if self.replicas == 1 or self.replica is None:
            return self.card_id
        return f"{self.card_id}.r{self.replica}"


def plan_card(card: Card, contract: Contract) -> CardPlan:
    m, kv, lim = contract.model, contract.kv_cache, contract.limits
    bpt = kvmath.kv_bytes_per_token(
        m.num_layers, m.num_kv_heads, m.head_dim, contract.precision.kv_cache
    )
    weights = kvmath.gib(m.weights_gib)
    card_mem = kvmath.gib(card.memory_gib)
    tokens = kvmath.pool_tokens(
        card_memory_bytes=card_mem,
        weights_bytes=weights,
        bytes_per_token=bpt,
        tokens_per_block=kv.tokens_per_block,
        free_gpu_memory_fraction=kv.free_gpu_memory_fraction,
        max_tokens=kv.max_tokens,
        replicas=card.replicas,
    )
    blocks = tokens // kv.tokens_per_block
    per_seq = kvmath.blocks_for(lim.max_input_len + lim.max_output_len, kv.tokens_per_block)
    return CardPlan(
        card=card,
        contract=contract,
        weights_bytes=weights,
        bytes_per_token=bpt,
        kv_pool_tokens=tokens,
        kv_pool_bytes=tokens * bpt,
        num_blocks=blocks,
        blocks_per_full_seq=per_seq,
        full_length_slots=blocks // per_seq,
        card_memory_bytes=card_mem,
        replicas=card.replicas,
    )


def replica_plans(plan: CardPlan) -> list[CardPlan]:
    """One plan per engine of the card (replica 0..N-1), each with the per-replica pool of the
    card's plan."""
    return [dataclasses.replace(plan, replica=i) for i in range(plan.replicas)]


def engine_plans(plans: Iterable[CardPlan]) -> list[CardPlan]:
    """Every engine of a node, card by card, replica by replica: what a runtime starts, one worker
    each."""
    return [rp for p in plans for rp in replica_plans(p)]


def one_engine(plan: CardPlan) -> Optional[str]:
    """Why an engine factory must not build from this plan ('' / None when it may): a card plan of N
    > 1 replicas describes N engines, and a runtime that hands it over whole would start one where
    the node declares N."""
    if plan.replicas > 1 and plan.replica is None:
        return (f"card {plan.card_id} declares replicas: {plan.replicas}; this runtime was given "
                "the card's plan, "
                "not one replica's (each replica is its own engine worker: "
                "forge.config.plan.engine_plans)")
    return None


def plan_node(node, contracts: dict[str, Contract]) -> list[CardPlan]:
    """One CardPlan per card, in the node's card order; every card's contract must be given."""
    from forge.errors import ForgeError

    missing = sorted({card.engine for card in node.cards if card.engine not in contracts})
    if missing:
        raise ForgeError(f"node {node.node}: no contract named {', '.join(missing)}")
    return [plan_card(card, contracts[card.engine]) for card in node.cards]
