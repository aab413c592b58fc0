"""The one accessor for engine backends: what the plugins registered (built-ins included), by name.

Every place that builds an engine (the engine host, the `faults` wrapper, the direct bench mode) asks here."""
from __future__ import annotations

import socket
from typing import Any, Callable

from forge.errors import ForgeError


def factories() -> dict[str, Callable[..., Any]]:
    """Backend name -> factory(contract, card_plan) -> Engine, as registered through forge_register_backends."""
    from forge.plugins import collect

    return {args[0]: args[1] for args in collect("forge_register_backends")}


def factory(name: str, *, card: str) -> Callable[..., Any]:
    """The factory of backend `name`, or one line saying it is not installed here."""
    known = factories()
    if name not in known:
        raise ForgeError(f"card {card}: backend {name!r} is not installed on {socket.gethostname()} "
                         f"(known: {', '.join(sorted(known))})")
    return known[name]
