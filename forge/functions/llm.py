"""The `llm` handle given to functions: turns generate/chat/embed calls into node requests.

The node behind it is any forge.node.interface.Node: the local node (`forge run`), a provisioned node over
HTTP (`forge deploy`), a Ray cluster (`forge deploy --cluster`), or the node `forge serve` serves a function's
record on (online priority, the request's deadline, a full node refused at once). The handle only makes the
GenerateParams; Node.submit applies every request rule (the prompt's check, chat templates, stop strings)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Optional

from forge.errors import ForgeError, RequestRejected
from forge.functions.api import LLM, FunctionSpec, GenerateParams, Generation
from forge.node.interface import Answer, Node, Prompt
from forge.requests.messages import Chat
from forge.stats import RunStats

_MADE_PARAMS_MAX = 256      # distinct generate settings a job's handle keeps made (cleared when full)


class NodeLLM(LLM):
    """One per job (or per online record). Counts the tokens its requests read and wrote into `stats` (the run's
    summary and progress). priority, deadline_at (a time.monotonic() instant: each request gets what is left of
    it) and wait=False (a full node refused at once) are an online record's (forge/serve/functions_api.py)."""

    def __init__(self, node: Node, spec: Optional[FunctionSpec] = None, *, stats: Optional[RunStats] = None,
                 priority: int = 0, deadline_at: Optional[float] = None, wait: bool = True):
        self._node = node
        self._cap = spec.max_output_tokens if spec else None
        self._stats = stats
        self._priority = priority
        self._deadline_at = deadline_at
        self._wait = wait
        self._made: dict[tuple, GenerateParams] = {}     # bounded: _MADE_PARAMS_MAX

    async def generate(self, prompt, *, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                       choice=None, json_schema=None, stop=None, include_stop_str_in_output=False) -> Generation:
        params = self._params(max_tokens, temperature, top_p, top_k, seed, choice, json_schema, stop,
                              include_stop_str_in_output)
        return (await self._submit(prompt, params)).generation

    async def chat(self, messages, *, max_tokens, temperature=0.0, top_p=1.0, top_k=0, seed=None, choice=None,
                   json_schema=None, stop=None, include_stop_str_in_output=False) -> Generation:
        params = self._params(max_tokens, temperature, top_p, top_k, seed, choice, json_schema, stop,
                              include_stop_str_in_output)
        return (await self._submit(Chat.of(messages), params)).generation

    async def embed(self, text) -> list[float]:
        answer = await self._submit(text, GenerateParams(max_tokens=1, embed=True, priority=self._priority))
        if answer.hidden is None:
            raise ForgeError(f"card {answer.generation.card}: its backend returns no hidden state")
        return list(answer.hidden)

    async def _submit(self, prompt: Prompt, params: GenerateParams) -> Answer:
        if self._deadline_at is not None:
            left = self._deadline_at - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError("deadline exceeded")
            params = replace(params, deadline_s=left)
        answer = await self._node.submit(prompt, params, wait=self._wait)
        if self._stats is not None:
            gen = answer.generation
            self._stats.input_tokens += gen.input_tokens      # an embed reads its prompt and writes no token
            self._stats.output_tokens += 0 if params.embed else gen.output_tokens
        return answer

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
