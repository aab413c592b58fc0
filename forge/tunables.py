"""What `forge bench sweep` may vary in a backend's own contract section, as the backend declares
it.

A backend declares a function (its Backend's `tunables`) that, for a contract and the card it would
run on, lists its tunable section fields in the order a sweep should try them, each with candidate
values. A value this machine cannot run (an absent package, a kernel that does not exist for this
card) carries the reason instead of being left out, so the sweep report says what was not tried and
why. Whether a value breaks a contract rule is not decided here: the sweep writes every candidate as
a contract and runs the one validation pipeline on it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

MAX_CHOICES = 16  # values of one field a sweep tries at most: the candidate space stays bounded
# contract fields (outside the backend's section) a backend may declare as tunable, where its engine
# takes several
CONTRACT_FIELDS = ("kv_cache.tokens_per_block",)


@dataclass(frozen=True)
class Choice:
    value: Any
    unavailable: Optional[str] = None     # why this value cannot run on this machine; None: it can
    note: str = ""                        # what the value means, when its name does not say it


@dataclass(frozen=True)
class Tunable:
    field: str                            # "<section>.<field>", e.g. "transformers.use_cuda_graph"
    choices: tuple[Choice, ...]
    note: str = ""

    @property
    def section(self) -> str:
        return self.field.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.field.split(".", 1)[1]


def tunables_for(contract, card) -> list[Tunable]:
    """The backend's declared tunables for this contract on this card ([] when the backend declares
    none)."""
    from forge.backends import get
    from forge.errors import ForgeError

    backend = get(contract.backend)
    if backend is None or backend.tunables is None:
        return []
    out = list(backend.tunables(contract, card))
    for t in out:
        own = "." in t.field and (t.section == contract.backend or t.field in CONTRACT_FIELDS)
        if not own or len(t.choices) > MAX_CHOICES:
            raise ForgeError(f"plugin error: backend {contract.backend!r} declares tunable "
                             f"{t.field!r} with "
                             f"{len(t.choices)} choices (a field of its own section or one of "
                             f"{', '.join(CONTRACT_FIELDS)}, at most {MAX_CHOICES} choices)")
    return out
