"""Rules the schema cannot express: inside one contract, a contract against its artifact, a node
against its contracts (memory, slots, architecture). Each rule is a small function returning
Problems."""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Optional, Sequence

from forge.config import checkpoint_dir, kvmath
from forge.config.messages import did_you_mean
from forge.config.models import Contract, NodeDescription
from forge.config.plan import CardPlan
from forge.config.units import fmt_bytes
from forge.errors import ForgeError, Problem

FP8_MIN_CC = (8, 9)        # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later


def _cc(text: Optional[str]) -> Optional[tuple[int, int]]:
    if text is None:
        return None
    major, minor = text.split(".")
    return int(major), int(minor)


# ----------------------------------------------------------------------------- one contract
def budget_holds_a_prompt(c: Contract, file: str) -> list[Problem]:
    lim = c.limits
    out = []
    if lim.max_num_tokens < lim.max_input_len:
        out.append(Problem(file, "$.limits.max_num_tokens",
                           f"max_num_tokens {lim.max_num_tokens} is below max_input_len "
                           f"{lim.max_input_len}: a "
                           "full-length prompt could never be scheduled in one step"))
    if lim.max_num_tokens < lim.max_batch_size:
        out.append(Problem(file, "$.limits.max_num_tokens",
                           f"max_num_tokens {lim.max_num_tokens} is below max_batch_size "
                           f"{lim.max_batch_size}: at "
                           "most max_num_tokens sequences can decode in one step", "warning"))
    return out


def precision_fits_target(c: Contract, file: str) -> list[Problem]:
    cc = _cc(c.target.compute_capability)
    out = []
    if cc is not None and cc < FP8_MIN_CC:
        for part in ("weights", "kv_cache"):
            if getattr(c.precision, part) == "fp8":
                out.append(Problem(file, f"$.precision.{part}",
                                   f"fp8 needs compute capability 8.9 or higher; the target is "
                                   f"{c.target.compute_capability}"))
    return out


def host_cache_is_used(c: Contract, file: str) -> list[Problem]:
    if c.kv_cache.host_cache_bytes > 0 and not c.kv_cache.block_reuse:
        return [Problem(file, "$.kv_cache.host_cache_size", "a host cache only holds reusable "
                                                            "blocks; with "
                        "block_reuse false it is allocated and never used", "warning")]
    return []


def _backend_checks(checks: Sequence[Callable], c: Contract, file: str) -> list[Problem]:
    """The registered backends' checks of one contract (Backend.contract_rules / artifact_checks),
    in order."""
    out: list[Problem] = []
    for check in checks:
        try:
            out += check(c, file)
        except Exception as e:  # a plugin bug is not a problem in the user's file
            raise ForgeError(f"validation rule {getattr(check, '__qualname__', check)!r} failed: "
                             f"{type(e).__name__}: {e}") from e
    return out


def check_contract(c: Contract, file: str, *, contract_rules: Sequence[Callable] = (),
                   artifact_checks: Sequence[Callable] = ()) -> list[Problem]:
    """forge's rules of one contract file, with the backends' own where they belong: theirs of the
    contract's fields after forge's, their artifact checks before the checkpoint's and the
    tokenizer's files are read."""
    out = budget_holds_a_prompt(c, file) + precision_fits_target(c, file)
    out += _backend_checks(contract_rules, c, file)
    out += host_cache_is_used(c, file)
    out += _backend_checks(artifact_checks, c, file)
    if c.artifact.checkpoint is not None:
        out += checkpoint_dir.check_checkpoint(c, file)
    return out + checkpoint_dir.check_tokenizer(c, file)


# ----------------------------------------------------------------------------- one node
def card_indices_unique(n: NodeDescription, file: str) -> list[Problem]:
    counts = Counter(card.index for card in n.cards)
    return [Problem(file, f"$.cards[{i}].index", f"card index {card.index} is declared "
                                                 f"{counts[card.index]} times")
            for i, card in enumerate(n.cards) if counts[card.index] > 1]


def card_cores_distinct(n: NodeDescription, file: str) -> list[Problem]:
    """A card's cores are named once, no more of them than the host has, and two CPU cards never
    share one (a core shared by two CPU cards makes their speeds each other's)."""
    out: list[Problem] = []
    owner: dict[int, int] = {}
    for i, card in enumerate(n.cards):
        if card.cores is None:
            continue
        at = f"$.cards[{i}].cores"
        twice = sorted(c for c, k in Counter(card.cores).items() if k > 1)
        if twice:
            out.append(Problem(file, at, f"core {twice[0]} is named "
                                         f"{Counter(card.cores)[twice[0]]} times"))
        if len(set(card.cores)) > n.host.cpu_cores:
            out.append(Problem(file, at, f"{len(set(card.cores))} cores named; the host declares "
                               f"{n.host.cpu_cores} (host.cpu_cores)"))
        if card.kind != "cpu":
            continue
        for c in sorted(set(card.cores)):
            if c in owner:
                out.append(Problem(file, at, f"core {c} is also cpu card "
                                             f"{n.cards[owner[c]].index}'s "
                                   f"($.cards[{owner[c]}].cores): two CPU cards on one core share "
                                   "its speed"))
                break
            owner[c] = i
    return out


def ports_distinct(n: NodeDescription, file: str) -> list[Problem]:
    if n.metrics.port != 0 and n.metrics.port == n.control.port:
        return [Problem(file, "$.metrics.port", f"port {n.metrics.port} is also the control port")]
    return []


def cards_reference_contracts(n: NodeDescription, file: str, contracts: dict[str, Contract],
                              broken: Iterable[str] = ()) -> list[Problem]:
    """Cards naming a contract that does not exist. Contracts that failed to load are reported on
    their own."""
    broken = set(broken)
    return [
        Problem(
            file,
            f"$.cards[{i}].engine",
            f"no contract named {card.engine!r}{did_you_mean(card.engine, contracts)}",
        )
        for i, card in enumerate(n.cards)
        if card.engine not in contracts and card.engine not in broken
    ]


def cards_match_targets(
    n: NodeDescription, file: str, contracts: dict[str, Contract]
) -> list[Problem]:
    out = []
    for i, card in enumerate(n.cards):
        c = contracts.get(card.engine)
        if c is None:
            continue
        if c.target.kind != card.kind:
            out.append(Problem(file, f"$.cards[{i}].kind", f"contract {c.contract} targets a "
                                                           f"{c.target.kind} card; "
                               f"this card is {card.kind}"))
        elif card.kind == "gpu" and c.target.compute_capability != card.compute_capability:
            out.append(Problem(file, f"$.cards[{i}].compute_capability",
                               f"contract {c.contract} was built for compute capability "
                               f"{c.target.compute_capability}; this card is "
                               f"{card.compute_capability}"))
    return out


def _runs_on(c: Contract, card) -> bool:
    return c.target.kind == card.kind and (
        card.kind != "gpu" or c.target.compute_capability == card.compute_capability
    )


def cards_hold_engines(n: NodeDescription, file: str, plans: list[CardPlan]) -> list[Problem]:
    """Memory fit and full-length slots; cards whose contract cannot run on them at all are left
    out."""
    out = []
    index = {id(card): i for i, card in enumerate(n.cards)}
    for p in plans:
        if not _runs_on(p.contract, p.card):
            continue
        i = index[id(p.card)]
        lim, kv = p.contract.limits, p.contract.kv_cache
        if not p.fits_memory and p.replicas > 1:
            out.append(Problem(file, f"$.cards[{i}].replicas",
                               f"{p.replicas} replicas x (weights {fmt_bytes(p.weights_bytes)} + "
                               "KV pool "
                               f"{fmt_bytes(p.kv_pool_bytes)}) of {p.contract.contract} = "
                               f"{fmt_bytes(p.card_bytes)} "
                               f"exceed the card's {fmt_bytes(p.card_memory_bytes)}"))
        elif not p.fits_memory:
            out.append(Problem(file, f"$.cards[{i}].memory_gib",
                               f"weights {fmt_bytes(p.weights_bytes)} + KV pool "
                               f"{fmt_bytes(p.kv_pool_bytes)} of "
                               f"{p.contract.contract} exceed the card's "
                               f"{fmt_bytes(p.card_memory_bytes)}"))
        seq = lim.max_input_len + lim.max_output_len
        if p.full_length_slots < 1:
            out.append(Problem(file, f"$.cards[{i}].engine",
                               f"the KV pool of {p.contract.contract} on this card holds "
                               f"{p.num_blocks} blocks "
                               f"of {kv.tokens_per_block} tokens; one full-length sequence ({seq} "
                               "tokens) needs "
                               f"{p.blocks_per_full_seq}"))
        elif p.full_length_slots < lim.max_batch_size:
            out.append(Problem(file, f"$.cards[{i}].engine",
                               f"the KV pool of {p.contract.contract} on this card holds "
                               f"{p.full_length_slots} "
                               f"full-length sequences ({p.num_blocks} blocks, "
                               f"{p.blocks_per_full_seq} per "
                               f"sequence), below max_batch_size {lim.max_batch_size}", "warning"))
    return out


def host_cache_fits_host(
    n: NodeDescription, file: str, contracts: dict[str, Contract]
) -> list[Problem]:
    total = sum(
        c.replicas * contracts[c.engine].kv_cache.host_cache_bytes
        for c in n.cards
        if c.engine in contracts
    )
    limit = kvmath.gib(n.host.memory_gib)
    if total > limit:
        return [Problem(file, "$.host.memory_gib", "the cards' host KV caches add up to "
                                                   f"{fmt_bytes(total)}, more "
                        f"than the host's {fmt_bytes(limit)}")]
    return []


def host_has_cores_for_replicas(n: NodeDescription, file: str) -> list[Problem]:
    """Each replica is one engine process whose Python loop keeps a core busy: a node that declares
    replicas must have a core for every engine process of every card (checked only once replicas are
    declared)."""
    if all(card.replicas == 1 for card in n.cards):
        return []
    total = sum(card.replicas for card in n.cards)
    if total <= n.host.cpu_cores:
        return []
    per_card = ", ".join(f"{card.kind}{card.index}: {card.replicas}" for card in n.cards)
    return [Problem(file, "$.host.cpu_cores", f"the cards run {total} engine processes "
                                              f"({per_card}) but the host has "
                    f"{n.host.cpu_cores} cores: each replica is one engine process bound by its "
                    "own Python loop")]


def check_node(n: NodeDescription, file: str, contracts: dict[str, Contract], plans: list[CardPlan],
               broken: Iterable[str] = ()) -> list[Problem]:
    out = card_indices_unique(n, file) + card_cores_distinct(n, file) + ports_distinct(n, file)
    out += cards_reference_contracts(n, file, contracts, broken)
    out += cards_match_targets(n, file, contracts)
    out += cards_hold_engines(n, file, plans)
    out += host_cache_fits_host(n, file, contracts)
    out += host_has_cores_for_replicas(n, file)
    return out

