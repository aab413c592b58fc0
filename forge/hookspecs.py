"""Every plugin hook forge calls. Built-in backends and probes implement these like any third
party."""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("forge")
hookimpl = pluggy.HookimplMarker("forge")


@hookspec
def forge_register_backend(register):
    """Call register(forge.backends.Backend(...)) once per engine backend: its name, contract
    section model, engine factory, tunables, working memory, validation rules and engine arguments,
    as one object."""


@hookspec
def forge_register_probes(register):
    """Call register(name, probe) where probe() -> list[ProbedCard]; every probe's cards are
    merged."""


@hookspec
def forge_validation_rules(register):
    """Call register(rule) where rule(loaded: LoadedSet) -> iterable of Problem; runs after built-in
    checks."""


@hookspec
def forge_register_commands(cli):
    """Add click commands to the `forge` command group."""
