"""The KV pool and slots of a contract `forge contract new` drafts, and why a card too small for it
is refused.

The pool is the largest whole-block pool that takes at most --kv-fraction of what the weights and
the backend's working memory (transformers: an attention mask that grows with max_num_tokens and the
pool) leave of the card: a search over block counts, each step the plan's own arithmetic (plan_card)
and the backend's own working memory, as validation computes them. A card that cannot hold one
full-length sequence is refused with the numbers that decide it (weights, attention mask, pool) and
each flag that would lift it, with what it would give where forge can compute it (flash attention's
pool, computed the same way)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.config import kvmath
from forge.config.models import (
    Artifact,
    Card,
    Contract,
    KvCache,
    Limits,
    ModelGeometry,
    Precision,
    Target,
)
from forge.config.plan import CardPlan, plan_card
from forge.config.units import fmt_bytes
from forge.errors import ForgeError

BACKEND = "transformers"
MAX_DEFAULT_SLOTS = 256
# what builds no attention mask on a GPU (transformers.attn_implementation)
FLASH = "flash_attention_2"
FLASH_KINDS = ("flash_attention_2", "flash_attention_3")


@dataclass
class Lengths:
    in_len: int
    out_len: int
    budget: int
    notes: dict[str, str]


@dataclass
class Sizing:
    req: Any                        # contract_new.Request
    shape: Any                      # model_size.ModelShape
    weights_gib: float
    precision: str
    lengths: Lengths
    tpb: int
    fraction: float
    section: Any                    # the backend's section model
    name: str
    checkpoint: str


@dataclass
class Pool:
    contract: Contract
    plan: CardPlan
    working_bytes: int
    full: int                       # full-length sequences the pool holds
    slots: int
    notes: dict[str, str] = field(default_factory=dict)
    few_slots_note: str = ""


def make_card(req, engine: str) -> Card:
    return Card(
        index=0,
        kind=req.card,
        model="cpu" if req.card == "cpu" else "gpu",
        memory_gib=req.memory_gib,
        compute_capability=req.compute_capability,
        engine=engine,
    )


def make_contract(s: Sizing, pool_tokens: int, slots: int, section=None) -> Contract:
    """The contract of sizing `s` with this pool and slot count (another section: to ask "what
    if")."""
    req, shape, lengths = s.req, s.shape, s.lengths
    c = Contract(
        contract=s.name,
        backend=BACKEND,
        model=ModelGeometry(
            architecture=shape.architecture,
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            vocab_size=shape.vocab_size,
            weights_gib=s.weights_gib,
        ),
        artifact=Artifact(checkpoint=s.checkpoint),
        precision=Precision(weights=s.precision, kv_cache=s.precision),
        limits=Limits(
            max_batch_size=slots,
            max_num_tokens=lengths.budget,
            max_input_len=lengths.in_len,
            max_output_len=lengths.out_len,
        ),
        kv_cache=KvCache(
            tokens_per_block=s.tpb,
            max_tokens=max(pool_tokens, s.tpb),
            host_cache_size=0,
            block_reuse=True,
        ),
        target=Target(kind=req.card, compute_capability=req.compute_capability),
        sections={BACKEND: section if section is not None else s.section},
    )
    c._source = Path(os.path.abspath(req.out))
    return c


def working(plan: CardPlan) -> int:
    from forge.config.working_memory import working_memory

    return sum(n for _, n in working_memory(plan))


def _bytes_per_token(s: Sizing) -> int:
    return kvmath.kv_bytes_per_token(
        s.shape.num_layers, s.shape.num_kv_heads, s.shape.head_dim, s.precision
    )


def largest_pool(s: Sizing, section) -> tuple[int, int]:
    """(blocks, working memory at that pool): the largest pool within fraction x (card - weights -
    working)."""
    card, card_bytes, weights_bytes = (
        make_card(s.req, s.name),
        kvmath.gib(s.req.memory_gib),
        kvmath.gib(s.weights_gib),
    )

    def fits(blocks: int) -> tuple[bool, int]:
        plan = plan_card(card, make_contract(s, blocks * s.tpb, 1, section))
        work = working(plan)
        return plan.kv_pool_bytes <= s.fraction * (card_bytes - weights_bytes - work), work

    lo, hi = 0, kvmath.pool_tokens(card_memory_bytes=card_bytes, weights_bytes=weights_bytes,
                                   bytes_per_token=_bytes_per_token(s), tokens_per_block=s.tpb,
                                   free_gpu_memory_fraction=s.fraction, max_tokens=None) // s.tpb
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid)[0]:
            lo = mid
        else:
            hi = mid - 1
    return lo, fits(lo)[1]


def size_pool(s: Sizing) -> Pool:
    """The pool, slots and contract; a ForgeError explaining the card's shortfall when one sequence
    does not fit."""
    req, lengths = s.req, s.lengths
    blocks, work = largest_pool(s, s.section)
    seq = lengths.in_len + lengths.out_len
    per_seq = kvmath.blocks_for(seq, s.tpb)
    if blocks < per_seq:
        raise ForgeError(_too_small(s, blocks, work, per_seq))
    full = blocks // per_seq
    cap = min(MAX_DEFAULT_SLOTS, lengths.budget)
    slots = req.slots or min(full, cap)
    contract = make_contract(s, blocks * s.tpb, slots)
    plan = plan_card(make_card(req, s.name), contract)
    working_bytes = working(plan)
    bpt = _bytes_per_token(s)
    card_bytes, weights_bytes = kvmath.gib(req.memory_gib), kvmath.gib(s.weights_gib)
    shape = s.shape
    notes = {
        "max_batch_size": "--slots" if req.slots else (
            "the full-length sequences the pool holds" if full <= cap else
            f"at most {cap} ({'the budget' if cap == lengths.budget else 'the default cap'}); the "
            "pool holds "
            f"{full:,} full-length sequences"),
        "max_tokens": f"the largest pool of whole blocks within {s.fraction:g} x (card "
                      f"{fmt_bytes(card_bytes)} - "
                      f"weights {fmt_bytes(weights_bytes)} - working memory {fmt_bytes(work)}) at "
                      f"{bpt:,} bytes per "
                      f"token (2 x {shape.num_layers} layers x {shape.num_kv_heads} KV heads x "
                      f"{shape.head_dim} "
                      f"head_dim x {kvmath.KV_DTYPE_BYTES[s.precision]} bytes) = "
                      f"{plan.num_blocks:,} blocks, "
                      f"{fmt_bytes(plan.kv_pool_bytes)}; {full:,} full-length ({seq}-token) "
                      "sequences",
    }
    few = (f"note: {slots} slot{'s' if slots > 1 else ''} only: after the weights "
           f"({fmt_bytes(weights_bytes)}) and "
           f"the working memory ({fmt_bytes(work)}), {s.fraction:g} of the card's "
           f"{fmt_bytes(card_bytes)} holds a "
           f"pool of {blocks * s.tpb:,} KV tokens, {full} full-length "
           f"sequence{'s' if full > 1 else ''} of {seq:,} "
           "tokens (max_input_len + max_output_len); shorter --max-input-len / --max-output-len or "
           "more "
           "--memory-gib give more slots")
    return Pool(
        contract=contract,
        plan=plan,
        working_bytes=working_bytes,
        full=full,
        slots=slots,
        notes=notes,
        few_slots_note=few,
    )


def _too_small(s: Sizing, blocks: int, work: int, per_seq: int) -> str:
    """Why no full-length sequence fits, with the numbers, and what each flag that lifts it would
    change."""
    req, lengths, section = s.req, s.lengths, s.section
    card_bytes, weights_bytes = kvmath.gib(req.memory_gib), kvmath.gib(s.weights_gib)
    need = per_seq * s.tpb
    seq = f"one full-length sequence (max_input_len {lengths.in_len:,} + max_output_len {lengths.out_len:,}) needs " \
          f"{need:,} KV tokens ({fmt_bytes(need * _bytes_per_token(s))})"
    if weights_bytes >= card_bytes:
        return (f"--memory-gib {req.memory_gib:g}: the weights alone ({fmt_bytes(weights_bytes)}, "
                f"{s.precision}) do "
                f"not fit the card's {fmt_bytes(card_bytes)}: give a larger card (--memory-gib)"
                + (" or --weights bf16 (half the bytes)" if s.precision == "fp32" else ""))
    attn = section.attn_implementation
    parts = [f"--memory-gib {req.memory_gib:g}: {s.fraction:g} x (card {fmt_bytes(card_bytes)} - "
             "weights "
             f"{fmt_bytes(weights_bytes)} - "
             + (f"the {attn} attention mask {fmt_bytes(work)}" if work else "working memory 0 B")
             + f") holds {blocks * s.tpb:,} KV tokens; {seq}."]
    lifts = []
    if work:
        parts.append(f"The attention mask is why: transformers builds it for every {attn} step, "
                     "max_num_tokens "
                     f"{lengths.budget:,} rows against the whole pool, and it grows with both.")
        if req.card == "gpu" and attn not in FLASH_KINDS:
            flash = section.model_validate({**section.model_dump(), "attn_implementation": FLASH})
            fb, _ = largest_pool(s, flash)
            gives = (
                f"a pool of {fb * s.tpb:,} KV tokens, {fb // per_seq} full-length sequence(s)"
                if fb >= per_seq
                else f"still only {fb * s.tpb:,} KV tokens"
            )
            lifts.append(f"flash attention, which builds no mask: --attn-implementation {FLASH} "
                         "(the contract's "
                         "transformers.attn_implementation; needs the flash-attn package) gives "
                         f"{gives}")
        if (
            lengths.budget > lengths.in_len
            and not req.budget
            and req.slots
            and lengths.budget == req.slots
        ):
            lifts.append("fewer --slots (the default budget, the mask's rows, is at least --slots "
                         f"{req.slots:,}) "
                         "or a --budget below them")
        elif lengths.budget > lengths.in_len:
            lifts.append("a smaller --budget (the mask's rows; at least max_input_len "
                         f"{lengths.in_len:,})")
        if req.card == "cpu":
            parts.append("Flash attention, which has no mask, needs a GPU.")
    lifts.append("shorter --max-input-len / --max-output-len")
    lifts.append("more --memory-gib")
    if s.precision == "fp32":
        lifts.append("--weights bf16 (half the bytes for weights and KV)")
    if s.fraction < 1:
        lifts.append(f"--kv-fraction above {s.fraction:g}")
    return " ".join(parts) + " Lifted by: " + "; or ".join(lifts)
