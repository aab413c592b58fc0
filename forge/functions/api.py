"""What a function author sees: `@forge.function`, the `llm` handle, and `Generation`.

    @forge.function(max_output_tokens=128)
    async def summarize(record: dict, llm: forge.LLM) -> dict:
        out = await llm.generate(f"Summarize:\\n{record['text']}", max_tokens=128)
        return {"summary": out.text}

A function may await llm.generate any number of times, in sequence or concurrently
(asyncio.gather). Nothing is truncated: a prompt that fits no engine on the node raises
RequestRejected, which fails that record with the reason."""
from __future__ import annotations

import abc
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence

from forge import constants
from forge.errors import RequestRejected

_SPEC_ATTR = "__forge_function__"


@dataclass(frozen=True)
class Generation:
    text: str
    output_tokens: int
    input_tokens: int
    finish_reason: str                # "eos" | "length" | "stop"
    card: str = ""                    # the card whose engine produced it, e.g. "cpu0"
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class FunctionSpec:
    fn: Callable[..., Awaitable[Any]]
    name: str
    max_output_tokens: Optional[int] = None   # the most any one generate() of this function asks for
    concurrency: Optional[int] = None         # records in flight for this function (default: constants)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class GenerateParams:
    """One generate call as the node receives it (from a function's llm handle or over HTTP)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    choice: Optional[tuple[str, ...]] = None
    json_schema: Optional[dict] = None
    embed: bool = False
    priority: int = 0
    deadline_s: Optional[float] = None
    stop: tuple[str, ...] = ()                  # cut the text at the first of these (forge/runtime/stops.py)
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        why = params_problem(self)
        if why is not None:
            raise RequestRejected(why)
        object.__setattr__(self, "temperature", float(self.temperature))   # checked finite numbers: engines take floats
        object.__setattr__(self, "top_p", float(self.top_p))


def params_problem(p: GenerateParams) -> Optional[str]:
    """Why an engine cannot represent this request as asked (None when it can). Checked on every GenerateParams
    made, whatever the edge (a function's llm handle, the node's HTTP endpoint, the OpenAI API): one top_k of 2^31
    or a NaN temperature reaching an engine loop kills it for every request on the card."""
    for name, lo in (("max_tokens", 1), ("top_k", 0)):
        v = getattr(p, name)
        if not _is_int(v) or not lo <= v <= constants.INT32_MAX:
            return f"{name} must be an int in [{lo}, 2**31 - 1], got {v!r}"
    if not _is_int(p.priority) or abs(p.priority) > constants.INT32_MAX:
        return f"priority must be an int within ±(2**31 - 1), got {p.priority!r}"
    t = p.temperature
    if not _is_finite(t) or not (t == 0 or constants.MIN_SAMPLING_TEMPERATURE <= t <= constants.MAX_SAMPLING_TEMPERATURE):
        return (f"temperature must be 0 (greedy) or a number in [{constants.MIN_SAMPLING_TEMPERATURE:g}, "
                f"{constants.MAX_SAMPLING_TEMPERATURE:g}], got {t!r}")
    if not _is_finite(p.top_p) or not 0 < p.top_p <= 1:
        return f"top_p must be in (0, 1], got {p.top_p!r}"
    if p.seed is not None and (not _is_int(p.seed) or not 0 <= p.seed < 2**63):
        return f"seed must be an int in [0, 2**63), got {p.seed!r}"
    if p.deadline_s is not None and (not _is_finite(p.deadline_s) or not 0 < p.deadline_s <= constants.MAX_DEADLINE_S):
        return f"deadline_s must be a number of seconds in (0, {constants.MAX_DEADLINE_S:g}], got {p.deadline_s!r}"
    if not isinstance(p.embed, bool):
        return f"embed must be true or false, got {p.embed!r}"
    if p.choice is not None and p.json_schema is not None:
        return "give choice or json_schema, not both"
    if p.stop:
        why = _stop_problem(p.stop)
        if why is None and (p.choice is not None or p.json_schema is not None):
            why = "stop strings do not apply to guided output (choice / json_schema): its text is always whole"
        if why is not None:
            return why
    if not isinstance(p.include_stop_str_in_output, bool):
        return f"include_stop_str_in_output must be true or false, got {p.include_stop_str_in_output!r}"
    if p.choice is not None:
        return _choice_problem(p.choice)
    if p.json_schema is not None:
        return _schema_problem(p.json_schema)
    return None


_INT_ONLY = frozenset({int})


def _plain_ids_in_range(prompt: list | tuple) -> bool:
    return set(map(type, prompt)) <= _INT_ONLY and (
        not prompt or (min(prompt) >= 0 and max(prompt) <= constants.INT32_MAX))


def plain_token_ids(prompt) -> Optional[tuple[int, ...]]:
    """A list or tuple of plain ints in [0, 2**31 - 1], as a tuple; None for anything else (which then takes
    prompt_problem's checks). A few passes in C: it runs for every request."""
    if (type(prompt) is list or type(prompt) is tuple) and _plain_ids_in_range(prompt):
        return prompt if type(prompt) is tuple else tuple(prompt)
    return None


def prompt_problem(prompt) -> Optional[str]:
    """A prompt is text (valid Unicode: a lone surrogate cannot be tokenized nor sent) or token ids (int32)."""
    if isinstance(prompt, str):
        bad = _unencodable(prompt)
        return None if bad is None else f"prompt is not valid Unicode text: {bad}"
    if isinstance(prompt, (list, tuple)):
        if _plain_ids_in_range(prompt):
            return None                       # plain ints in range, the usual case: a few passes in C
        for i, t in enumerate(prompt):
            if not _is_int(t) or not 0 <= t <= constants.INT32_MAX:
                return f"prompt token {i} is {t!r}; token ids are ints in [0, 2**31 - 1]"
        return None
    return f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"


def _unencodable(text: str) -> Optional[str]:
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return f"a lone surrogate (U+{ord(text[e.start]):04X}) at character {e.start}"


def _choice_problem(choice) -> Optional[str]:
    if (not isinstance(choice, (tuple, list)) or not choice
            or not all(isinstance(c, str) and c for c in choice)):
        return "choice must be a non-empty list of non-empty strings"
    if len(choice) > constants.MAX_GUIDE_CHOICES:
        return f"choice has {len(choice)} options; at most {constants.MAX_GUIDE_CHOICES} are taken"
    bad = next(((i, why) for i, c in enumerate(choice) if (why := _unencodable(c)) is not None), None)
    if bad is not None:
        return f"choice {bad[0]} is not valid Unicode text: {bad[1]}"
    size = sum(len(c.encode("utf-8")) for c in choice)
    if size > constants.MAX_GUIDE_BYTES:
        return f"choice options hold {size} bytes in all; at most {constants.MAX_GUIDE_BYTES} are taken"
    return None


def _stop_problem(stop) -> Optional[str]:
    if not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) and s for s in stop):
        return "stop must be a list of non-empty strings"
    if len(stop) > constants.MAX_STOP_STRINGS:
        return f"stop has {len(stop)} strings; at most {constants.MAX_STOP_STRINGS} are taken"
    long = next((i for i, s in enumerate(stop) if len(s) > constants.MAX_STOP_CHARS), None)
    if long is not None:
        return f"stop string {long} has {len(stop[long])} characters; at most {constants.MAX_STOP_CHARS} are taken"
    bad = next(((i, why) for i, s in enumerate(stop) if (why := _unencodable(s)) is not None), None)
    if bad is not None:
        return f"stop string {bad[0]} is not valid Unicode text: {bad[1]}"
    return None


def _schema_problem(schema) -> Optional[str]:
    if not isinstance(schema, dict):
        return f"json_schema must be a JSON object (a dict), got {type(schema).__name__}"
    try:
        size = len(json.dumps(schema, allow_nan=False, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as e:     # a set, NaN, a cycle, deep nesting, a lone surrogate
        return f"json_schema is not JSON: {type(e).__name__}: {str(e)[:200]}"
    if size > constants.MAX_GUIDE_BYTES:
        return f"json_schema is {size} bytes as JSON; at most {constants.MAX_GUIDE_BYTES} are taken"
    return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def function(fn: Optional[Callable] = None, *, max_output_tokens: Optional[int] = None, name: Optional[str] = None,
             concurrency: Optional[int] = None):
    """Mark an `async def f(record, llm)` as a forge function. Usable bare or with arguments."""

    def wrap(f: Callable) -> Callable:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"@forge.function needs an 'async def' function, got {f.__qualname__}")
        params = [p for p in inspect.signature(f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(params) < 2:
            raise TypeError(f"{f.__qualname__} must take (record, llm)")
        if max_output_tokens is not None and max_output_tokens <= 0:
            raise ValueError("max_output_tokens must be positive")
        if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                        or concurrency <= 0):
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")   # 0 workers: a hang
        setattr(f, _SPEC_ATTR, FunctionSpec(fn=f, name=name or f.__name__, max_output_tokens=max_output_tokens,
                                            concurrency=concurrency))
        return f

    return wrap(fn) if fn is not None else wrap


def spec_of(obj: Any) -> Optional[FunctionSpec]:
    try:
        spec = getattr(obj, _SPEC_ATTR, None)
    except Exception:  # noqa: BLE001 - module-level objects with a __getattr__ that raises (lazy modules)
        return None
    return spec if isinstance(spec, FunctionSpec) else None


class LLM(abc.ABC):
    """The handle a function gets. Its requests go through the node's broker and admission control."""

    @abc.abstractmethod
    async def generate(self, prompt: str | Sequence[int], *, max_tokens: int, temperature: float = 0.0,
                       top_p: float = 1.0, top_k: int = 0, seed: Optional[int] = None,
                       choice: Optional[Sequence[str]] = None, json_schema: Optional[dict] = None,
                       stop: Optional[Sequence[str]] = None, include_stop_str_in_output: bool = False) -> Generation:
        """Generate up to max_tokens tokens. choice / json_schema constrain the output (guided decoding); stop cuts
        the text at the first of these strings (finish_reason "stop"). docs/functions.md has every bound."""

    @abc.abstractmethod
    async def chat(self, messages: Sequence[dict], *, max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                   top_k: int = 0, seed: Optional[int] = None, choice: Optional[Sequence[str]] = None,
                   json_schema: Optional[dict] = None, stop: Optional[Sequence[str]] = None,
                   include_stop_str_in_output: bool = False) -> Generation:
        """generate() on the prompt the model's chat template makes of `messages` ([{"role", "content"}]); refused
        (RequestRejected) when the model has no chat template."""

    @abc.abstractmethod
    async def embed(self, text: str | Sequence[int]) -> list[float]:
        """The final hidden state for `text` (where the backend exposes it)."""
