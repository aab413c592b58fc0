"""Memory an engine allocates beside its weights and KV pool, as its backend computes it from the plan (the
forge_register_working_memory hook): the plan shows it per engine and counts it in the card's memory. Read lazily,
so importing forge.config never loads plugins."""
from __future__ import annotations

from forge.config.plan import CardPlan


def working_memory(plan: CardPlan) -> list[tuple[str, int]]:
    """(what, bytes) for one engine of this plan; empty where its backend registers nothing."""
    from forge.plugins import collect

    out: list[tuple[str, int]] = []
    for backend, working in collect("forge_register_working_memory"):
        if backend == plan.contract.backend:
            out += [(what, n) for what, n in working(plan) if n > 0]
    return out
