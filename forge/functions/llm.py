"""The `llm` handle given to functions: turns generate/chat/embed calls into node requests.

The node behind it is any forge.node.interface.Node: the local node (`forge run`), a provisioned
node over HTTP (`forge deploy`), a Ray cluster (`forge deploy --cluster`), or the node `forge serve`
serves a function's record on (online priority, the request's deadline, a full node refused at
once). The handle only makes the GenerateParams; Node.submit applies every request rule (the
prompt's check, chat templates, stop strings)."""
from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar
from dataclasses import replace
from typing import Optional

from forge.errors import ForgeError, RequestRejected
from forge.functions.api import LLM, FunctionSpec, GenerateParams, Generation
from forge.node.interface import Answer, Node, Prompt
from forge.requests.messages import Chat
from forge.stats import RunStats

_MADE_PARAMS_MAX = 256  # distinct generate settings a job's handle keeps made (cleared when full)
# A record's later calls go ahead of other records' earlier ones: its k-th call (k from 0) is queued
# at the job's priority minus (LATER_CALLS - k), and its calls from the LATER_CALLS-th on at the
# job's own. A record that has begun is finished first, so rows reach the ledger in a steady stream
# instead of every record's first call running before any second one (the broker's output classes
# put longer calls first within one priority). Steps, not the record's start order itself: a handful
# of priorities keeps the broker's prefix groups and output classes whole within each step, and
# within one priority the broker and the hosts go by arrival, which is start order already.
LATER_CALLS = 3


class RecordCalls:
    """The calls one record's function has made so far (the runner sets one per record:
    CURRENT_RECORD). One object shared by every task the function starts, so calls made in parallel
    count once each."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        self.made = 0

    def next_priority(self, base: int) -> int:
        step = self.made
        self.made = step + 1
        return base - (LATER_CALLS - step if step < LATER_CALLS else 0)


CURRENT_RECORD: ContextVar[Optional[RecordCalls]] = ContextVar("forge_current_record", default=None)


class NodeLLM(LLM):
    """One per job (or per online record). Counts the tokens its requests read and wrote into
    `stats` (the run's summary and progress). priority, deadline_at (a time.monotonic() instant:
    each request gets what is left of it) and wait=False (a full node refused at once) are an online
    record's (forge/serve/functions_api.py)."""

    def __init__(
        self,
        node: Node,
        spec: Optional[FunctionSpec] = None,
        *,
        stats: Optional[RunStats] = None,
        priority: int = 0,
        deadline_at: Optional[float] = None,
        wait: bool = True,
    ):
        self._node = node
        self._cap = spec.max_output_tokens if spec else None
        self._stats = stats
        self._priority = priority
        self._deadline_at = deadline_at
        self._wait = wait
        self._made: dict[tuple, GenerateParams] = {}     # bounded: _MADE_PARAMS_MAX

    async def generate(
        self,
        prompt,
        *,
        max_tokens,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=None,
        choice=None,
        json_schema=None,
        stop=None,
        include_stop_str_in_output=False,
    ) -> Generation:
        params = self._params(
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            choice,
            json_schema,
            stop,
            include_stop_str_in_output,
        )
        return (await self._submit(prompt, params)).generation

    async def chat(
        self,
        messages,
        *,
        max_tokens,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        seed=None,
        choice=None,
        json_schema=None,
        stop=None,
        include_stop_str_in_output=False,
    ) -> Generation:
        params = self._params(
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            choice,
            json_schema,
            stop,
            include_stop_str_in_output,
        )
        return (await self._submit(Chat.of(messages), params)).generation

    async def embed(self, text) -> list[float]:
        answer = await self._submit(
            text, GenerateParams(max_tokens=1, embed=True, priority=self._call_priority())
        )
        if answer.hidden is None:
            raise ForgeError(f"card {answer.generation.card}: its backend returns no hidden state")
        return list(answer.hidden)

    async def submit(self, prompt: Prompt, params: GenerateParams) -> Answer:
        """One request whose GenerateParams the caller made (forge's OpenAI batch job, which answers
        with the Answer's stop_reason and an embed's prompt tokens), sent as every request of this
        handle is: its priority, what is left of its deadline, counted in its stats, within the
        function's max_output_tokens."""
        if params.priority != self._priority:
            params = replace(params, priority=self._priority)
        if self._cap is not None and not params.embed and params.max_tokens > self._cap:
            raise RequestRejected(f"max_tokens={params.max_tokens} exceeds the function's "
                                  f"max_output_tokens={self._cap}")
        return await self._submit(prompt, params)

    async def _submit(self, prompt: Prompt, params: GenerateParams) -> Answer:
        if self._deadline_at is not None:
            left = self._deadline_at - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError("deadline exceeded")
            params = replace(params, deadline_s=left)
        if self._stats is None:
            return await self._node.submit(prompt, params, wait=self._wait)
        self._stats.calls_in_flight += 1
        try:
            answer = await self._node.submit(prompt, params, wait=self._wait)
        finally:
            self._stats.calls_in_flight -= 1
        gen = answer.generation
        # an embed reads its prompt and writes no token
        self._stats.input_tokens += gen.input_tokens
        self._stats.output_tokens += 0 if params.embed else gen.output_tokens
        return answer

    def _call_priority(self) -> int:
        record = CURRENT_RECORD.get()
        return self._priority if record is None else record.next_priority(self._priority)

    def _params(self, max_tokens, temperature, top_p, top_k, seed, choice, json_schema, stop,
                include_stop_str_in_output) -> GenerateParams:
        priority = self._call_priority()
        stop = (
            (stop,)
            if isinstance(stop, str)
            else tuple(stop)
            if isinstance(stop, (list, tuple))
            else stop
        )
        stop = stop if stop is not None else ()
        params = None
        key = None
        if choice is None and json_schema is None:
            # A job asks with the same few settings for every record: each distinct set is made and
            # checked once (a GenerateParams is frozen; ~3 us per call, docs/benchmarks.md "Control
            # plane"). The types are part of the key, so True is not taken for 1 nor 1 for 1.0.
            key = (type(max_tokens), max_tokens, type(temperature), temperature, type(top_p), top_p,
                   type(top_k), top_k, type(seed), seed, stop, type(include_stop_str_in_output),
                   include_stop_str_in_output, priority)
            try:
                params = self._made.get(key)
            except TypeError:           # an unhashable argument: GenerateParams below names it
                key = None
        if params is None:
            # GenerateParams refuses what no engine can represent (api.params_problem): one place
            # for every edge.
            params = GenerateParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                choice=tuple(choice) if isinstance(choice, (list, tuple)) else choice,
                json_schema=json_schema,
                priority=priority,
                stop=stop,
                include_stop_str_in_output=include_stop_str_in_output,
            )
            if choice is None and json_schema is None and key is not None:
                if len(self._made) >= _MADE_PARAMS_MAX:
                    self._made.clear()
                self._made[key] = params
        if self._cap is not None and max_tokens > self._cap:
            raise RequestRejected(f"max_tokens={max_tokens} exceeds the function's "
                                  f"max_output_tokens={self._cap}")
        return params
