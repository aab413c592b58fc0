"""The `llm` handle given to functions: turns generate/embed calls into node requests.

The node behind it is any forge.node.interface.Node: the local node (`forge run`), a provisioned node over
HTTP (`forge deploy`) or a Ray cluster (`forge deploy --cluster`); all offer `generate` and `embed`."""
from __future__ import annotations

from typing import Optional, Protocol, Sequence

from forge.errors import RequestRejected
from forge.functions.api import LLM, FunctionSpec, GenerateParams, Generation, prompt_problem


class NodeBackend(Protocol):
    async def generate(self, prompt: str | Sequence[int], params: GenerateParams) -> Generation: ...

    async def embed(self, prompt: str | Sequence[int]) -> list[float]: ...


_MADE_PARAMS_MAX = 256      # distinct generate settings a job's handle keeps made (cleared when full)


class NodeLLM(LLM):
    """One per job. Counts what the function asked for so the runner can report tokens per record."""

    def __init__(self, node: NodeBackend, spec: Optional[FunctionSpec] = None, *, priority: int = 0):
        self._node = node
        self._cap = spec.max_output_tokens if spec else None
        self._priority = priority
        self._made: dict[tuple, GenerateParams] = {}     # bounded: _MADE_PARAMS_MAX

    async def generate(self, prompt, *, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                       choice=None, json_schema=None, stop=None, include_stop_str_in_output=False) -> Generation:
        _check_prompt(prompt)
        params = self._params(max_tokens, temperature, top_p, top_k, seed, choice, json_schema, stop,
                              include_stop_str_in_output)
        return self._cut(await self._node.generate(prompt, params), params)

    async def chat(self, messages, *, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None, choice=None,
                   json_schema=None, stop=None, include_stop_str_in_output=False) -> Generation:
        from forge.requests.chat_template import apply_template, normalize

        params = self._params(max_tokens, temperature, top_p, top_k, seed, choice, json_schema, stop,
                              include_stop_str_in_output)
        node = _inner(self._node)
        tokenizers = list((getattr(node, "tokenizers", None) or {}).values())
        if not tokenizers and hasattr(self._node, "chat"):      # a provisioned node applies its own template
            return self._cut(await self._node.chat(normalize(messages), params), params)
        return self._cut(await self._node.generate(apply_template(tokenizers, messages), params), params)

    def _cut(self, gen: Generation, params: GenerateParams) -> Generation:
        """Stop strings, where the node did not apply them already (a provisioned node does, with its tokenizer)."""
        if not params.stop or gen.finish_reason == "stop":
            return gen
        from forge.requests.stops import StopRule, apply_stop, tokenizer_of

        cut, _ = apply_stop(gen, StopRule(params.stop, params.include_stop_str_in_output),
                            tokenizer_of(_inner(self._node), gen.card))
        return cut

    def _params(self, max_tokens, temperature, top_p, top_k, seed, choice, json_schema, stop,
                include_stop_str_in_output) -> GenerateParams:
        stop = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else stop
        stop = stop if stop is not None else ()
        params = None
        key = None
        if choice is None and json_schema is None:
            # A job asks with the same few settings for every record: each distinct set is made and checked once
            # (a GenerateParams is frozen; ~3 us per call, docs/benchmarks.md "Control plane").
            # The types are part of the key, so True is not taken for 1 nor 1 for 1.0.
            key = (type(max_tokens), max_tokens, type(temperature), temperature, type(top_p), top_p,
                   type(top_k), top_k, type(seed), seed, stop, type(include_stop_str_in_output),
                   include_stop_str_in_output)
            try:
                params = self._made.get(key)
            except TypeError:           # an unhashable argument: GenerateParams below names it
                key = None
        if params is None:
            # GenerateParams refuses what no engine can represent (api.params_problem): one place for every edge.
            params = GenerateParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                    seed=seed, choice=tuple(choice) if isinstance(choice, (list, tuple)) else choice,
                                    json_schema=json_schema, priority=self._priority, stop=stop,
                                    include_stop_str_in_output=include_stop_str_in_output)
            if choice is None and json_schema is None and key is not None:
                if len(self._made) >= _MADE_PARAMS_MAX:
                    self._made.clear()
                self._made[key] = params
        if self._cap is not None and max_tokens > self._cap:
            raise RequestRejected(f"max_tokens={max_tokens} exceeds the function's max_output_tokens={self._cap}")
        return params

    async def embed(self, text) -> list[float]:
        _check_prompt(text)
        return await self._node.embed(text)


def _inner(node):
    """The node behind the job's counting wrapper (its tokenizers live there)."""
    return getattr(node, "inner", node)


def _check_prompt(prompt) -> None:
    why = prompt_problem(prompt)
    if why is not None:
        raise RequestRejected(why)
