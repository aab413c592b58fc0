"""The candidate space of `forge bench sweep`: which tiers are tried, and why the others are not.

Dimensions: the backend's own switches as it declares them (its Backend's `tunables`; for
transformers: CUDA graphs, attention implementation, scheduler, async batching, compile level), the
token budget and the slots (½ and 2 x the contract's), and replicas per card. The space is bounded
by construction, never the full cross product:

1. the shipped tier (the contract as given) is measured first;
2. one change at a time from it: every value of every dimension other than the shipped one (slow
   dimensions, such as torch.compile with its long warm-up, last), plus the explicit combinations
   given with --try;
3. the single changes that beat the shipped tier by more than --min-gain are combined greedily, best
   first: each next winner is added to the best combination so far and kept only if it is faster
   again (at most --combine steps).

A value this machine cannot run (an absent package, a GPU-only switch on a CPU card, replicas on a
runtime of one engine per card) is listed as skipped with the backend's reason; a candidate that
breaks a contract rule is skipped with the validator's own message (each candidate is written as
files and loaded like a user's)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import pydantic

from forge.config.plan import CardPlan
from forge.errors import UsageError
from forge.tunables import Choice, Tunable, tunables_for

TOKENS, SLOTS, REPLICAS = "limits.max_num_tokens", "limits.max_batch_size", "card.replicas"
# a contract field a backend may declare tunable (forge/tunables.py)
BLOCK = "kv_cache.tokens_per_block"
DEFAULT_FACTORS = (0.5, 2.0)
DEFAULT_REPLICAS = (2,)
SLOW = ("transformers.compile_level", "vllm.enforce_eager")  # tried after every other single change


@dataclass
class Dimension:
    field: str
    choices: list[Choice]
    note: str = ""


@dataclass
class Candidate:
    key: str  # "base", or the changes as field=value joined by " + "
    changes: dict[str, Any]
    stage: str                                # base | one | try | combine
    status: str = "pending"                   # pending | skipped | ran | failed | cut
    reason: str = ""
    result: Optional[dict] = None             # the child's ModeResult dict
    wall_s: Optional[float] = None            # child process, start to exit (load, warm-up, window)
    folder: Optional[str] = None

    @property
    def tokens_per_s(self) -> Optional[float]:
        r = self.result
        if self.status != "ran" or not r or r["completed"] != r["requests"]:
            return None
        return r["tokens_per_s"]

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "stage": self.stage,
            "changes": self.changes,
            "status": self.status,
            "reason": self.reason,
            "tokens_per_s": self.tokens_per_s,
            "wall_s": self.wall_s,
            "folder": self.folder,
            "result": self.result,
        }


def fmt(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)


def key_of(changes: dict[str, Any]) -> str:
    return " + ".join(f"{f}={fmt(v)}" for f, v in changes.items()) or "base"


def around(value: int, factors: Sequence[float] = DEFAULT_FACTORS) -> list[int]:
    return sorted({max(1, int(round(value * f))) for f in factors} - {value})


def parse_value(text: str) -> Any:
    """A YAML scalar: true/false, numbers, or a string (attention names such as paged|sdpa stay strings)."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (bool, int, float, str)) else text


def parse_sets(items: Sequence[str], flag: str) -> dict[str, list]:
    """`FIELD=v1,v2` pairs (repeatable) -> {field: [values]}."""
    out: dict[str, list] = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or "." not in name or not values.strip():
            raise UsageError(f"{flag}: expected FIELD=VALUE[,VALUE...] with FIELD like "
                             "transformers.use_cuda_graph "
                             f"or limits.max_num_tokens, got {item!r}")
        out[name.strip()] = [parse_value(v.strip()) for v in values.split(",") if v.strip()]
    return out


def parse_try(items: Sequence[str]) -> list[dict[str, Any]]:
    """`--try a=1,b=true` (repeatable): explicit combined candidates."""
    out = []
    for item in items:
        changes: dict[str, Any] = {}
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if not sep or "." not in name or not value.strip():
                raise UsageError(f"--try: expected FIELD=VALUE[,FIELD=VALUE...], got {item!r}")
            changes[name.strip()] = parse_value(value.strip())
        out.append(changes)
    return out


def base_value(plan: CardPlan, name: str, sections: dict) -> Any:
    lim = plan.contract.limits
    if name == TOKENS:
        return lim.max_num_tokens
    if name == SLOTS:
        return lim.max_batch_size
    if name == REPLICAS:
        return plan.card.replicas
    if name == BLOCK:
        return plan.contract.kv_cache.tokens_per_block
    sec, _, attr = name.partition(".")
    current = plan.contract.sections.get(sec)
    if current is None and sec in sections:
        current = sections[sec]()
    return getattr(current, attr, None)


def replicas_unavailable(mode: str) -> Optional[str]:
    if mode == "direct":
        return ("the direct engine is one engine (a transformers manager, or vllm.LLM) in one "
                "process")
    return None


def dimensions(
    plan: CardPlan, *, mode: str, overrides: dict[str, list], skip: Sequence[str]
) -> list[Dimension]:
    """Every dimension the sweep explores, in the order it tries them."""
    lim = plan.contract.limits
    declared: list[Tunable] = tunables_for(plan.contract, plan.card)
    dims = [Dimension(t.field, list(t.choices), t.note) for t in declared]
    dims += [
        Dimension(
            TOKENS, [Choice(v) for v in around(lim.max_num_tokens)], "the token budget per step"
        ),
        Dimension(SLOTS, [Choice(v) for v in around(lim.max_batch_size)], "sequences in flight"),
        Dimension(
            REPLICAS,
            [Choice(v, replicas_unavailable(mode)) for v in DEFAULT_REPLICAS],
            "engines of this tier on the card, each its own process",
        ),
    ]
    known = {d.field: d for d in dims}
    for name in list(overrides) + list(skip):
        if name not in known:
            raise UsageError(f"no sweep dimension {name!r} for contract {plan.contract.contract} "
                             "(dimensions: "
                             f"{', '.join(known)})")
    for name, values in overrides.items():
        d = known[name]
        declared_choice = {fmt(c.value): c for c in d.choices}
        rep = replicas_unavailable(mode) if name == REPLICAS else None
        d.choices = [
            declared_choice.get(fmt(v), Choice(v, rep if (name == REPLICAS and v != 1) else None))
            for v in values
        ]
    dims = [d for d in dims if d.field not in skip]
    return [d for d in dims if d.field not in SLOW] + [d for d in dims if d.field in SLOW]


def single_changes(
    plan: CardPlan, dims: list[Dimension], tries: list[dict[str, Any]], sections: dict
) -> list[Candidate]:
    """Stage 2's candidates: one change at a time from the shipped tier, then the explicit --try combinations."""
    out = []
    for d in dims:
        shipped = base_value(plan, d.field, sections)
        for c in d.choices:
            if fmt(c.value) == fmt(shipped):
                continue
            cand = Candidate(key_of({d.field: c.value}), {d.field: c.value}, "one")
            if c.unavailable:
                cand.status, cand.reason = "skipped", c.unavailable
            out.append(cand)
    known = {d.field: d for d in dims}
    for changes in tries:
        cand = Candidate(key_of(changes), changes, "try")
        for name, value in changes.items():
            c = (
                next((c for c in known[name].choices if fmt(c.value) == fmt(value)), None)
                if name in known
                else None
            )
            if name not in known and name not in (TOKENS, SLOTS, REPLICAS):
                cand.status, cand.reason = "skipped", f"no sweep dimension {name!r}"
            elif c is not None and c.unavailable:
                cand.status, cand.reason = "skipped", f"{name}={fmt(value)}: {c.unavailable}"
        out.append(cand)
    return out


def winners(candidates: list[Candidate], base_tps: float, min_gain: float) -> list[Candidate]:
    """The best single change of each dimension that beat the shipped tier by more than min_gain, best first."""
    best: dict[str, Candidate] = {}
    for c in candidates:
        if (
            c.stage != "one"
            or c.tokens_per_s is None
            or c.tokens_per_s <= base_tps * (1 + min_gain)
        ):
            continue
        (name,) = c.changes
        if name not in best or c.tokens_per_s > best[name].tokens_per_s:
            best[name] = c
    return sorted(best.values(), key=lambda c: -c.tokens_per_s)


def apply(plan: CardPlan, changes: dict[str, Any], sections: dict):
    """(contract, card, None) with the changes made, or (None, None, why) when a value is not even well-formed
    (the full rules run when the written files are loaded)."""
    c, card = plan.contract, plan.card
    limits = {n.split(".", 1)[1]: v for n, v in changes.items() if n in (TOKENS, SLOTS)}
    upd: dict[str, Any] = {}
    if limits:
        try:
            upd["limits"] = type(c.limits).model_validate({**c.limits.model_dump(), **limits})
        except pydantic.ValidationError as exc:
            return None, None, f"$.limits: {_one_line(exc)}"
    if BLOCK in changes:
        try:
            upd["kv_cache"] = type(c.kv_cache).model_validate({**c.kv_cache.model_dump(),
                                                               "tokens_per_block": changes[BLOCK]})
        except pydantic.ValidationError as exc:
            return None, None, f"$.kv_cache: {_one_line(exc)}"
    new_sections = dict(c.sections)
    for name, value in changes.items():
        sec, _, attr = name.partition(".")
        if sec in ("limits", "card", "kv_cache"):
            continue
        model = sections.get(sec)
        if model is None:
            return None, None, f"no contract section {sec!r} is registered"
        current = new_sections.get(sec) or model()
        try:
            new_sections[sec] = model.model_validate({**current.model_dump(), attr: value})
        except pydantic.ValidationError as exc:
            return None, None, f"$.{name}: {_one_line(exc)}"
    contract = c.model_copy(update=dict(upd, sections=new_sections))
    if REPLICAS in changes:
        try:
            card = type(card).model_validate({**card.model_dump(), "replicas": changes[REPLICAS]})
        except pydantic.ValidationError as exc:
            return None, None, f"$.cards[].replicas: {_one_line(exc)}"
    return contract, card, None


def _one_line(exc: pydantic.ValidationError) -> str:
    return "; ".join(e["msg"] for e in exc.errors())


def folder_name(index: int, cand: Candidate) -> str:
    slug = "".join(
        ch if ch.isalnum() or ch in "-_." else "-" for ch in cand.key.replace(" + ", "+")
    )
    return f"{index:02d}-{slug[:80]}"


def best_of(candidates: list[Candidate]) -> Optional[Candidate]:
    ran = [c for c in candidates if c.tokens_per_s is not None]
    return max(ran, key=lambda c: c.tokens_per_s, default=None)

