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
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence

# The request's own types live below the node (forge/requests/); function authors import them from
# here.
from forge.requests import (Generation, GenerateParams, params_problem, plain_token_ids,  # noqa: F401
                            prompt_problem)

_SPEC_ATTR = "__forge_function__"


@dataclass(frozen=True)
class FunctionSpec:
    fn: Callable[..., Awaitable[Any]]
    name: str
    max_output_tokens: Optional[int] = None  # the most any one generate() of this function asks for
    concurrency: Optional[int] = None  # records in flight for this function (default: constants)
    extra: dict = field(default_factory=dict)


def function(
    fn: Optional[Callable] = None,
    *,
    max_output_tokens: Optional[int] = None,
    name: Optional[str] = None,
    concurrency: Optional[int] = None,
):
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
        if concurrency is not None and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency <= 0
        ):
            # 0 workers: a hang
            raise ValueError(f"concurrency must be a positive int, got {concurrency!r}")
        setattr(
            f,
            _SPEC_ATTR,
            FunctionSpec(
                fn=f,
                name=name or f.__name__,
                max_output_tokens=max_output_tokens,
                concurrency=concurrency,
            ),
        )
        return f

    return wrap(fn) if fn is not None else wrap


def spec_of(obj: Any) -> Optional[FunctionSpec]:
    try:
        spec = getattr(obj, _SPEC_ATTR, None)
    except Exception:  # noqa: BLE001 - module-level objects with a __getattr__ that raises (lazy modules)
        return None
    return spec if isinstance(spec, FunctionSpec) else None


class LLM(abc.ABC):
    """The handle a function gets. Its requests go through the node's broker and admission
    control."""

    @abc.abstractmethod
    async def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: Optional[int] = None,
        choice: Optional[Sequence[str]] = None,
        json_schema: Optional[dict] = None,
        stop: Optional[Sequence[str]] = None,
        include_stop_str_in_output: bool = False,
    ) -> Generation:
        """Generate up to max_tokens tokens. choice / json_schema constrain the output (guided
        decoding); stop cuts the text at the first of these strings (finish_reason "stop").
        docs/functions.md has every bound."""

    @abc.abstractmethod
    async def chat(
        self,
        messages: Sequence[dict],
        *,
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: Optional[int] = None,
        choice: Optional[Sequence[str]] = None,
        json_schema: Optional[dict] = None,
        stop: Optional[Sequence[str]] = None,
        include_stop_str_in_output: bool = False,
    ) -> Generation:
        """generate() on the prompt the model's chat template makes of `messages` ([{"role",
        "content"}]); refused (RequestRejected) when the model has no chat template."""

    @abc.abstractmethod
    async def embed(self, text: str | Sequence[int]) -> list[float]:
        """The final hidden state for `text` (where the backend exposes it)."""
