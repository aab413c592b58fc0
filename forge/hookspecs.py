"""Every plugin hook forge calls. Built-in backends and probes implement these like any third party."""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("forge")
hookimpl = pluggy.HookimplMarker("forge")


@hookspec
def forge_register_backends(register):
    """Call register(name, factory, section_model=None): factory(contract, card_plan) -> Engine."""


@hookspec
def forge_register_contract_sections(register):
    """Call register(key, pydantic_model) to allow a top-level contract section such as `transformers:`."""


@hookspec
def forge_register_probes(register):
    """Call register(name, probe) where probe() -> list[ProbedCard]; every probe's cards are merged."""


@hookspec
def forge_validation_rules(register):
    """Call register(rule) where rule(loaded: LoadedSet) -> iterable of Problem; runs after built-in checks."""


@hookspec
def forge_register_commands(cli):
    """Add click commands to the `forge` command group."""


@hookspec
def forge_register_tunables(register):
    """Call register(backend, tunables) where tunables(contract, card) -> list[forge.tunables.Tunable]: the fields
    of the backend's contract section that `forge bench sweep` may vary, with their candidate values, each marked
    unavailable (and why) where this machine cannot run it."""


@hookspec
def forge_register_working_memory(register):
    """Call register(backend, working) where working(card_plan) -> list[(what, bytes)]: memory one engine of the plan
    allocates beside its weights and KV pool that the contract alone decides (an attention mask, say). The plan
    (`forge provision --dry-run`) shows it, and the card's memory counts it."""
