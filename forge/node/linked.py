"""What a local node and a cluster job share: one broker over every engine, one link per engine, the
callers' futures, and giving up on engines that are gone.

The broker sees every engine's geometry (read from its host's hello), so grouping, token budgets,
prefix affinity and speed-proportional balancing work the same across the cards of one machine and
across the nodes of a cluster. Requests travel to hosts in batches (forge/link/link.py).

Engines that stop working: down.py."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import replace
from typing import Any, AsyncIterator, Optional, Sequence

from forge.broker import Broker, BrokerCore, BrokerRequest, NoEngineFits
from forge.engines.interface import Guide
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.gc_tuning import tune_for_throughput
from forge.link.encoder import EncodeFailed, Encoder
from forge.host.protocol import Hello, WireResult
from forge.link.link import HOST_STATS_LAG_S, EngineLink
from forge.link.transport import Transport
from forge.node.down import EnginesOut
from forge.node.interface import Answer, Node, Prompt, TextTokenizer
from forge.requests import DEFAULT_OPTIONS, REFUSED, GenerateParams, Generation, RequestOptions
from forge.requests.chat_template import apply_template
from forge.requests.messages import Chat
from forge.requests.guided import guided_output_problem
from forge.requests.prompt_bounds import checked_prompt
from forge.requests.schema_check import schema_problem
from forge.requests.stops import StopRule, apply_stop
from forge.node.streamed import stream_request
from forge.stats import BrokerStats, EngineStats

log = logging.getLogger("forge.node")

class LinkedNode(Node):
    label_prefix = "node "          # how messages name this node ("node local: ...")
    # a link being brought back counts toward down_grace_s (no bound of its own)
    restarting_counts = True

    def __init__(
        self, name: str, *, grouping: bool = True, down_grace_s: float, sweep_interval_s: float
    ):
        self.name, self.grouping = name, grouping
        self.down_grace_s, self.sweep_interval_s = down_grace_s, sweep_interval_s
        self.links: dict[str, EngineLink] = {}
        self.encoders: dict[str, Encoder] = {}
        # tokenizer key -> this process's copy (none on a cluster)
        self.tokenizers: dict[str, Any] = {}
        self.broker: Optional[Broker] = None
        self._futures: dict[str, asyncio.Future] = {}
        # rid -> (attempt, text) pieces of a streamed request; None ends
        self._streams: dict[str, asyncio.Queue] = {}
        # Request ids: a random per-node prefix + a counter. uuid4 per request cost ~9 % of the
        # control plane's CPU (one urandom syscall each; forge bench control-plane,
        # docs/benchmarks.md).
        self._rid_prefix, self._rid_seq = uuid.uuid4().hex[:12], itertools.count()
        self._sweeper: Optional[asyncio.Task] = None
        self._keys: tuple[str, ...] = ()
        self.prompt_chars_limit = 0  # longer text prompts fit no card (0: not known, not checked)
        self.abandoned = 0
        self.closed = False
        self.down: Optional[str] = None
        self.started_at = 0.0

    @property
    def label(self) -> str:
        return f"{self.label_prefix}{self.name}"

    # ------------------------------------------------------------------ lifecycle
    def attach_links(self, engines: list[tuple[Transport, Hello]]) -> None:
        """Build the broker over these engines (transport, hello) and start their links."""
        self.broker = Broker(
            BrokerCore(
                [info.geometry for _, info in engines], grouping=self.grouping, node=self.name
            )
        )
        for transport, info in engines:
            lk = EngineLink(
                transport,
                info,
                broker=self.broker,
                rid_prefix=self._rid_prefix,
                settle=self._settle,
                fail=self._fail,
                wanted=self._wanted,
                progress=self._progress,
            )
            self.links[lk.eid] = lk
        self._keys = tuple(sorted({lk.key for lk in self.links.values()}))
        for lk in self.links.values():
            lk.start()
        watch = EnginesOut(
            self.links,
            self.broker,
            label=self.label,
            down_grace_s=self.down_grace_s,
            sweep_interval_s=self.sweep_interval_s,
            restarting_counts=self.restarting_counts,
            fail=self._fail,
            node_down=self._node_down,
            running=self._running,
        )
        self._sweeper = asyncio.create_task(watch.sweep(), name="node-sweep")
        self.started_at = time.time()
        tune_for_throughput()  # the node is up: what lives now lives as long as it does

    def _use_encoders(self, keys) -> None:
        """Tokenize prompts for these tokenizer keys through the hosts that have them
        (forge/link/encoder.py)."""
        for key in keys:
            self.encoders[key] = Encoder(key, [lk for lk in self.links.values() if lk.key == key])

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting and sending; wait (bounded) until every dispatched request has its
        answer."""
        self.closed = True
        if self.broker is not None:
            self.broker.close()
        for lk in self.links.values():
            lk.draining = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            lk.state == "up" and not lk.idle() for lk in self.links.values()
        ):
            await asyncio.sleep(0.05)
        return all(lk.idle() and lk.state == "up" for lk in self.links.values())

    async def stop(self) -> None:
        self.closed = True
        if self.broker is not None:
            self.broker.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await asyncio.gather(*(lk.close() for lk in self.links.values()), return_exceptions=True)
        await asyncio.gather(*(e.close() for e in self.encoders.values()), return_exceptions=True)
        await self._release()
        for rid, fut in self._futures.items():
            if not fut.done():
                fut.set_exception(ForgeError(f"{self.label} stopped before the request finished"))
                self._end_stream(rid)
        self._futures.clear()

    async def _release(self) -> None:
        """End what this node started for its engines (nothing, for engines that outlive the
        node)."""

    def _running(self) -> bool:
        return not self.closed and not self.down

    def _node_down(self, details: str) -> None:
        """Every engine is out (down.py): everything waiting fails with NodeDown, and so does what
        comes."""
        self.down = f"{self.label}: no engine can work ({details})"
        log.error(self.down)
        for fut in list(self._futures.values()):
            if not fut.done():
                fut.set_exception(NodeDown(self.down))

    # ------------------------------------------------------------------ requests
    def tokenizer_keys(self) -> tuple[str, ...]:
        return self._keys

    def encode_now(self, prompt: str | Sequence[int]) -> Optional[dict[str, tuple[int, ...]]]:
        """The prompt's ids per tokenizer when they can be had without waiting (ids given, or local
        copies)."""
        if not isinstance(prompt, str):
            ids = tuple(map(int, prompt))
            return dict.fromkeys(self._keys, ids)
        return None

    async def encode(self, prompt: str | Sequence[int]) -> dict[str, tuple[int, ...]]:
        """The prompt's ids per tokenizer; `prompt` passed submit's check (text no tokenizer takes
        must not fail the batch it would travel in)."""
        now = self.encode_now(prompt)
        if now is not None:
            return now
        keys = list(self.encoders)
        got = await asyncio.gather(
            *(self.encoders[k].encode(prompt) for k in keys), return_exceptions=True
        )
        out = {k: g for k, g in zip(keys, got) if not isinstance(g, BaseException)}
        for g in got:
            if isinstance(g, BaseException) and not isinstance(g, EncodeFailed):
                raise g
        out.update(self._encode_locally(prompt))
        if not out:
            raise NodeDown(f"{self.label}: no engine could tokenize the prompt ({got[0]})")
        return out

    def _encode_locally(self, prompt: str) -> dict[str, tuple[int, ...]]:
        return {}

    async def submit(self, prompt: Prompt, params: GenerateParams, *, wait: bool = True) -> Answer:
        """The whole request (forge/node/interface.py): a chat rendered with the model's template
        (bounded, off the loop), the prompt checked once, tokenized, handed to the broker; the
        engine's answer checked against its guide and cut at its stop strings. A full broker is
        waited out (wait=True) or refused at once with QueueFull (wait=False: the online path
        answers 429). Cancelling the caller (a client gone, a deadline) takes the request back:
        dropped if still queued, cancelled in its engine if not."""
        req, fut, guide = await self._enqueue(prompt, params, wait, None)
        try:
            eid, res = await fut
        except BaseException:
            self._abandon(req)
            raise
        finally:
            self._futures.pop(req.request_id, None)
        return self._answer(eid, res, params, guide)

    async def _enqueue(
        self, prompt: Prompt, params: GenerateParams, wait: bool, pieces: Optional[asyncio.Queue]
    ):
        """The request checked, tokenized and in the broker: (broker request, its future, its
        guide). `pieces`: a streamed request's queue of output pieces."""
        if self.down:
            raise NodeDown(self.down)
        if self.closed or self.broker is None:
            raise RequestRejected(f"{self.label} is not accepting requests")
        opts = RequestOptions.of(params)
        if pieces is not None:
            opts = replace(opts or DEFAULT_OPTIONS, stream=True)
        guide = opts.guide if opts is not None else None
        if guide is not None:
            self._check_guide_support(guide)
        if isinstance(prompt, Chat):
            prompt = await asyncio.to_thread(apply_template, list(self.tokenizers.values()), prompt,
                                             limit_chars=self.prompt_chars_limit)
        prompt = checked_prompt(prompt, self.prompt_chars_limit, self.name)
        prompts = self.encode_now(prompt)
        if prompts is None:
            prompts = await self.encode(prompt)
        rid = f"{self._rid_prefix}{next(self._rid_seq):x}"
        req = BrokerRequest(
            request_id=rid,
            prompts=prompts,
            max_new_tokens=params.max_tokens,
            payload=opts,
            priority=params.priority,
        )
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._futures[rid] = fut
        if pieces is not None:
            self._streams[rid] = pieces
        try:
            if wait and not self.broker.has_room():
                await self.broker.put(req)      # waits for room
            else:
                self.broker.put_nowait(req)  # what put does when there is room, without a coroutine
        except NoEngineFits as e:
            self._futures.pop(rid, None)
            self._streams.pop(rid, None)
            raise RequestRejected(str(e)) from None
        except BaseException:
            self._futures.pop(rid, None)
            self._streams.pop(rid, None)
            raise
        return req, fut, guide

    def _answer(
        self, eid: str, res: WireResult, params: GenerateParams, guide: Optional[Guide]
    ) -> Answer:
        """The engine's result as the caller's Answer: refusals and failures raised, the guide
        checked, stops cut."""
        finish, error, text = res.finish_reason, res.error, res.text
        if finish == REFUSED:              # the engine cannot take it as asked: the caller's to fix
            raise RequestRejected(f"card {eid}: {error}")
        if finish == "error" or error:
            raise ForgeError(f"card {eid}: {error or 'engine error'}")
        if finish == "cancelled":
            raise ForgeError(f"card {eid}: the request was cancelled")
        if guide is not None:
            problem = guided_output_problem(text, guide)
            # the caller's budget, not the engine, ended it
            if problem is not None and finish == "length":
                raise RequestRejected(
                    f"card {eid}: the guided answer was cut at max_tokens "
                    f"{params.max_tokens} "
                    f"before it completed its guide ({problem}); raise max_tokens",
                    param="max_tokens",
                )
            if problem is not None:
                raise ForgeError(f"card {eid}: guided output failed its check: {problem}")
        ids = res.output_ids
        gen = Generation(
            text=text,
            output_tokens=len(ids),
            input_tokens=res.input_tokens,
            finish_reason=finish,
            card=eid,
            token_ids=tuple(ids),
        )
        matched = None
        if params.stop:
            gen, matched = apply_stop(gen, StopRule(params.stop, params.include_stop_str_in_output),
                                      self.tokenizer_for(eid))
        return Answer(gen, res.hidden, matched)

    def tokenizer_for(self, card: Optional[str] = None) -> Optional[TextTokenizer]:
        key = self.links[card].key if card in self.links else None
        return (
            self.tokenizers.get(key)
            if key in self.tokenizers
            else next(iter(self.tokenizers.values()), None)
        )

    def _check_guide_support(self, guide: Guide) -> None:
        kind = "choice" if guide.choice is not None else "json_schema"
        if not any(kind in lk.info.guides for lk in self.links.values()):
            have = ", ".join(f"{eid}: {lk.info.guides or 'none'}" for eid, lk in self.links.items())
            raise RequestRejected(f"no card on {self.label} supports guided output of kind {kind} "
                                  f"({have})")
        problem = schema_problem(guide.json_schema) if guide.json_schema is not None else None
        if problem:
            raise RequestRejected(problem)

    def _abandon(self, req: BrokerRequest) -> None:
        """The caller stopped waiting: a request still in the broker is dropped when a link takes
        it; the link that dispatched it asks its host to cancel it (its KV reservation lasts until
        the engine lets go)."""
        self.abandoned += 1
        for lk in self.links.values():
            if lk.cancel(req.request_id):
                break

    def _wanted(self, req: BrokerRequest) -> bool:
        return req.request_id in self._futures

    def _settle(self, req: BrokerRequest, eid: str, res: WireResult) -> None:
        fut = self._futures.get(req.request_id)
        if fut is not None and not fut.done():
            fut.set_result((eid, res))
            self._end_stream(req.request_id)

    def _fail(self, req: BrokerRequest, message: str, cls: type = ForgeError) -> None:
        fut = self._futures.get(req.request_id)
        if fut is not None and not fut.done():
            fut.set_exception(cls(message))
            self._end_stream(req.request_id)

    def _progress(self, req: BrokerRequest, attempt: int, text: str) -> None:
        pieces = self._streams.get(req.request_id)
        if pieces is not None:
            pieces.put_nowait((attempt, text))

    def _end_stream(self, rid: str) -> None:
        pieces = self._streams.get(rid)
        if pieces is not None:
            pieces.put_nowait(None)

    def stream(
        self, prompt: Prompt, params: GenerateParams, *, wait: bool = True
    ) -> AsyncIterator[str | Answer]:
        return stream_request(self, prompt, params, wait=wait)

    def open_requests(self) -> int:
        """Callers waiting for an answer (queued or in an engine)."""
        return len(self._futures)

    # ------------------------------------------------------------------ observation
    engine_stats_lag_s = HOST_STATS_LAG_S

    def engine_stats(self) -> list[EngineStats]:
        return [s for lk in self.links.values() if (s := lk.stats()) is not None]

    async def read_engine_stats(self) -> list[EngineStats]:
        got = await asyncio.gather(*(lk.read_stats() for lk in self.links.values()))
        return [s for s in got if s is not None]

    def broker_stats(self) -> BrokerStats:
        return self.broker.stats() if self.broker else BrokerStats(node=self.name)

    def healthy_cards(self) -> list[str]:
        return [eid for eid, lk in self.links.items() if lk.state == "up" and lk.healthy]

