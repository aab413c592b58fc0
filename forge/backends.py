"""A backend is one object: `Backend` names the engine, its contract section, its engine factory and
everything else forge asks of it (tunables for `forge bench sweep`, working memory for the plan,
validation rules, the engine arguments `forge provision --dry-run` prints). Built-in and third-party
backends register theirs the same way, through the one hook `forge_register_backend` (as llm's
plugins register a Model):

    @hookimpl
    def forge_register_backend(register):
        register(Backend(name="mine", factory=build_engine, section=MySection, rules=(my_rule,)))

This module is also the one accessor for what was registered. It imports no engine library: every
callable a Backend holds imports its library only when called."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Callable, Optional

from forge.errors import ForgeError


@dataclass(frozen=True)
class Backend:
    name: str                       # `backend:` in a contract
    factory: Callable[..., Any]     # (contract, card_plan) -> Engine; blocks while it loads
    section: Optional[type] = None  # pydantic model of the contract section named like the backend
    # (contract, card) -> list[forge.tunables.Tunable]
    tunables: Optional[Callable[..., list]] = None
    # (card_plan) -> [(what, bytes)] beside weights and KV
    working_memory: Optional[Callable[..., list]] = None
    # (loaded: LoadedSet) -> iterable of Problem, after built-in checks
    rules: tuple[Callable[..., Any], ...] = ()
    # (contract, file) -> problems, run by forge's own checks of one contract file on every
    # contract, whatever its backend (a contract file whose name another file reuses is still
    # checked, in its place among forge's rules): contract_rules beside the rules of the contract's
    # own fields, artifact_checks where its artifact's files are read (TensorRT-LLM: a trtllm target
    # is a GPU; an engine directory is its artifact, checked against its files)
    contract_rules: tuple[Callable[..., list], ...] = ()
    artifact_checks: tuple[Callable[..., list], ...] = ()
    # (contract, card_plan) -> what the engine is given
    engine_arguments: Optional[Callable[..., dict]] = None
    # () -> variables the engine host sets (None: clears)
    environment: Optional[Callable[[], dict]] = None
    label: str = ""                              # one line for listings, e.g. "vLLM (v1 engine)"
    # (contract, card_plan) -> problems: the installed engine's own configuration objects built from
    # what forge would pass, without a device; run by `forge validate` only, where `engine_library`
    # can be imported
    engine_check: Optional[Callable[..., list]] = None
    engine_library: str = ""  # the module engine_check imports (its absence skips the check)


def registered() -> dict[str, Backend]:
    """Backend name -> Backend, as the plugins registered them (built-ins included); a name twice is
    refused."""
    from forge.plugins import collect

    out: dict[str, Backend] = {}
    for args in collect("forge_register_backend"):
        if len(args) != 1 or not isinstance(args[0], Backend):
            raise ForgeError("plugin error: forge_register_backend takes one "
                             "forge.backends.Backend, got "
                             f"{args!r:.200}")
        b = args[0]
        if b.name in out:
            raise ForgeError(f"plugin error: backend {b.name!r} is registered twice")
        out[b.name] = b
    return out


def get(name: str) -> Optional[Backend]:
    return registered().get(name)


def factories() -> dict[str, Callable[..., Any]]:
    """Backend name -> factory(contract, card_plan) -> Engine."""
    return {name: b.factory for name, b in registered().items()}


def factory(name: str, *, card: str) -> Callable[..., Any]:
    """The factory of backend `name`, or one line saying it is not installed here."""
    known = registered()
    if name not in known:
        raise ForgeError(f"card {card}: backend {name!r} is not installed on "
                         f"{socket.gethostname()} "
                         f"(known: {', '.join(sorted(known))})")
    return known[name].factory


def engine_check_problems(loaded) -> list:
    """`forge validate`: each card plan's contract checked by its backend's engine_check where the
    engine library is importable here (once per contract). A contract forge's own rules already
    refuse is not built again."""
    import importlib.util

    from forge.errors import ConfigError

    known, out, seen = registered(), [], set()
    for plans in loaded.plans.values():
        for plan in plans:
            contract = plan.contract
            b = known.get(contract.backend)
            if b is None or b.engine_check is None or contract.contract in seen:
                continue
            seen.add(contract.contract)
            if b.engine_library and importlib.util.find_spec(b.engine_library) is None:
                continue
            try:
                out += list(b.engine_check(contract, plan))
            except ConfigError:
                continue                 # the same problems the backend's rules reported already
    return out
