"""What forge calls things on a Ray cluster: custom resources, actor names, the namespace.

A provisioned node advertises, on its Ray node:
    forge_node:<node>        1                  which forge node this Ray node is
    forge_card:<card model>  cards of that model (slugged: "NVIDIA GeForce RTX 5090" -> nvidia-geforce-rtx-5090)
    forge_tier:<contract>    cards running that engine tier
Each engine actor holds one forge_card and one forge_tier unit for its whole life, so an engine only
ever runs on a card of its model and tier, and a card never runs two engines."""
from __future__ import annotations

import re
from collections import Counter

NAMESPACE = "forge"
NODE_PREFIX = "forge_node:"
CARD_PREFIX = "forge_card:"
TIER_PREFIX = "forge_tier:"
ENGINE_ACTOR_PREFIX = "engine:"
NODE_RECORD_PREFIX = "node:"

_SLUG = re.compile(r"[^a-z0-9._-]+")


def slug(text: str) -> str:
    """A resource-name-safe form of a card model or node name."""
    s = _SLUG.sub("-", text.strip().lower()).strip("-")
    return s or "unnamed"


def node_resource(node: str) -> str:
    return NODE_PREFIX + node


def card_resource(model: str) -> str:
    return CARD_PREFIX + slug(model)


def tier_resource(contract: str) -> str:
    return TIER_PREFIX + contract


def node_resources(loaded) -> dict[str, float]:
    """The custom resources a provisioned node advertises (a LoadedDescription in, Ray's --resources
    out)."""
    out: Counter = Counter({node_resource(loaded.node.node): 1})
    for p in loaded.plans:
        out[card_resource(p.card.model)] += 1
        out[tier_resource(p.contract.contract)] += 1
    return {k: float(v) for k, v in out.items()}


def engine_resources(plan) -> dict[str, float]:
    """What one engine actor holds for life: one card of its model, one unit of its tier."""
    return {card_resource(plan.card.model): 1.0, tier_resource(plan.contract.contract): 1.0}


def engine_id(node: str, card_id: str) -> str:
    """An engine's id across the cluster (broker, metrics' card key, Generation.card): node/card."""
    return f"{node}/{card_id}"


def engine_actor_name(node: str, card_id: str) -> str:
    return ENGINE_ACTOR_PREFIX + engine_id(node, card_id)


def node_record_name(node: str) -> str:
    return NODE_RECORD_PREFIX + node


def forge_node_of(resources: dict) -> str | None:
    """The forge node a Ray node's resources name, if any."""
    for key in resources:
        if key.startswith(NODE_PREFIX):
            return key[len(NODE_PREFIX):]
    return None
