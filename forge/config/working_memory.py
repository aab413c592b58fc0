"""Memory an engine allocates beside its weights and KV pool, as its backend computes it from the
plan (the Backend's working_memory): the plan shows it per engine and counts it in the card's
memory. Read lazily, so importing forge.config never loads plugins."""
from __future__ import annotations

from forge.config.plan import CardPlan


def working_memory(plan: CardPlan) -> list[tuple[str, int]]:
    """(what, bytes) for one engine of this plan; empty where its backend registers nothing."""
    from forge.backends import get

    backend = get(plan.contract.backend)
    if backend is None or backend.working_memory is None:
        return []
    return [(what, n) for what, n in backend.working_memory(plan) if n > 0]
