"""The `llm` handle given to functions: turns generate/embed calls into node requests.

The node behind it is any forge.node.interface.Node: the local node (`forge run`), a provisioned node over
HTTP (`forge deploy`) or a Ray cluster (`forge deploy --cluster`); all offer `generate` and `embed`."""
from __future__ import annotations

import math
from typing import Optional, Protocol, Sequence

from forge.errors import RequestRejected
from forge.functions.api import LLM, FunctionSpec, GenerateParams, Generation


class NodeBackend(Protocol):
    async def generate(self, prompt: str | Sequence[int], params: GenerateParams) -> Generation: ...

    async def embed(self, prompt: str | Sequence[int]) -> list[float]: ...


class NodeLLM(LLM):
    """One per job. Counts what the function asked for so the runner can report tokens per record."""

    def __init__(self, node: NodeBackend, spec: Optional[FunctionSpec] = None, *, priority: int = 0):
        self._node = node
        self._cap = spec.max_output_tokens if spec else None
        self._priority = priority

    async def generate(self, prompt, *, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                       choice=None, json_schema=None) -> Generation:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
            raise RequestRejected(f"max_tokens must be a positive int, got {max_tokens!r}")
        if self._cap is not None and max_tokens > self._cap:
            raise RequestRejected(f"max_tokens={max_tokens} exceeds the function's max_output_tokens={self._cap}")
        _check_prompt(prompt)
        _check_sampling(temperature, top_p, top_k, seed)
        if choice is not None and json_schema is not None:
            raise RequestRejected("give choice or json_schema, not both")
        if choice is not None and (not choice or not all(isinstance(c, str) and c for c in choice)):
            raise RequestRejected("choice must be a non-empty list of non-empty strings")
        params = GenerateParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                                top_k=int(top_k), seed=seed, choice=tuple(choice) if choice is not None else None,
                                json_schema=json_schema, priority=self._priority)
        return await self._node.generate(prompt, params)

    async def embed(self, text) -> list[float]:
        return await self._node.embed(text)


def _check_prompt(prompt) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return
    raise RequestRejected(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")


def _check_sampling(temperature, top_p, top_k, seed) -> None:
    """Refuse here what would otherwise reach the engine: one NaN temperature kills a sampler for everyone."""
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not number(temperature) or temperature < 0:
        raise RequestRejected(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not number(top_p) or not 0 < top_p <= 1:
        raise RequestRejected(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise RequestRejected(f"top_k must be an int >= 0, got {top_k!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise RequestRejected(f"seed must be an int in [0, 2**63), got {seed!r}")
