"""What plugins add to validation: backend names, contract sections, extra rules (per loaded set,
per contract file).

Read lazily (only when a file is validated), so importing forge.config never loads plugins."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from pydantic import BaseModel

from forge.errors import ForgeError

# Top-level contract keys owned by forge itself; a plugin section may not reuse them.
RESERVED_CONTRACT_KEYS = frozenset(
    {
        "contract",
        "backend",
        "model",
        "artifact",
        "precision",
        "limits",
        "kv_cache",
        "target",
        "sections",
    }
)


@dataclass(frozen=True)
class Registry:
    backends: frozenset[str] = frozenset()
    sections: dict[str, type[BaseModel]] = field(default_factory=dict)
    rules: tuple[Callable, ...] = ()
    # (contract, file) -> problems: Backend.contract_rules
    contract_rules: tuple[Callable, ...] = ()
    # (contract, file) -> problems: Backend.artifact_checks
    artifact_checks: tuple[Callable, ...] = ()


def build(
    backends: Iterable[tuple],
    sections: Iterable[tuple],
    rules: Iterable[tuple],
    *,
    contract_rules: Iterable[Callable] = (),
    artifact_checks: Iterable[Callable] = (),
) -> Registry:
    """A Registry from the tuples the register-style hooks produced; refuses clashing registrations."""
    names: set[str] = set()
    secs: dict[str, type[BaseModel]] = {}

    def add_section(key: str, model) -> None:
        if key in RESERVED_CONTRACT_KEYS:
            raise ForgeError(f"plugin error: contract section {key!r} clashes with a built-in "
                             "contract key")
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ForgeError(f"plugin error: contract section {key!r} must be a pydantic model "
                             "class")
        if key in secs and secs[key] is not model:
            raise ForgeError(f"plugin error: contract section {key!r} is registered twice")
        secs[key] = model

    for args in backends:
        name = args[0]
        if name in names:
            raise ForgeError(f"plugin error: backend {name!r} is registered twice")
        names.add(name)
        if len(args) > 2 and args[2] is not None:
            add_section(name, args[2])
    for key, model in sections:
        add_section(key, model)
    return Registry(
        backends=frozenset(names),
        sections=secs,
        rules=tuple(args[0] for args in rules),
        contract_rules=tuple(contract_rules),
        artifact_checks=tuple(artifact_checks),
    )


def from_plugins() -> Registry:
    """The registry as the installed plugins define it: each registered Backend's name, section and rules (its
    per-file contract rules and artifact checks too), then the node-wide rules of forge_validation_rules."""
    from forge.backends import registered
    from forge.plugins import collect

    backends = list(registered().values())
    return build(
        [(b.name, b.factory, b.section) for b in backends],
        [],
        [(rule,) for b in backends for rule in b.rules] + collect("forge_validation_rules"),
        contract_rules=[rule for b in backends for rule in b.contract_rules],
        artifact_checks=[check for b in backends for check in b.artifact_checks],
    )
