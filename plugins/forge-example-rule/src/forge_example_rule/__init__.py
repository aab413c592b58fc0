"""Example forge plugin: each card keeps memory headroom beyond its engine's weights + KV pool."""
from __future__ import annotations

import os
from typing import Iterable

from forge.errors import Problem
from forge.hookspecs import hookimpl

HEADROOM_ENV = "FORGE_MIN_HEADROOM_GIB"
DEFAULT_MIN_HEADROOM_GIB = 1.0
GIB = 2**30


def min_headroom_gib() -> float:
    raw = os.environ.get(HEADROOM_ENV, str(DEFAULT_MIN_HEADROOM_GIB))
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{HEADROOM_ENV} must be a number of GiB, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{HEADROOM_ENV} cannot be negative, got {raw!r}")
    return value


def card_headroom(loaded) -> Iterable[Problem]:
    """One error per card whose plan leaves less than the minimum headroom."""
    from forge.errors import display_path

    minimum = min_headroom_gib()
    for name, plans in loaded.plans.items():
        node = loaded.nodes[name]
        file = display_path(node.source) if node.source else f"<node {name}>"
        for plan in plans:
            i = next(i for i, card in enumerate(node.cards) if card is plan.card)
            used = plan.card_bytes            # every replica's weights + KV pool
            headroom = (plan.card_memory_bytes - used) / GIB
            if headroom < minimum:
                yield Problem(file, f"$.cards[{i}]",
                              f"headroom {headroom:.2f} GiB on {plan.card.model} is below the site minimum of "
                              f"{minimum:.2f} GiB (weights {plan.weights_bytes / GIB:.2f} GiB + KV pool "
                              f"{plan.kv_pool_bytes / GIB:.2f} GiB of {plan.card_memory_bytes / GIB:.2f} GiB)")


@hookimpl
def forge_validation_rules(register):
    register(card_headroom)
