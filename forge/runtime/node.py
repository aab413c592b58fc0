"""A provisioned node in this process: one engine per card, each behind its admission runtime, all
fed by one broker. `forge run` embeds it; `forge provision` serves it over HTTP (server.py)."""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from forge import constants
from forge.broker import Broker, BrokerCore, BrokerRequest, EngineGeometry, NoEngineFits
from forge.config.load import LoadedNode
from forge.config.plan import CardPlan
from forge.engines.interface import Engine, EngineResult, Guide, Sampling
from forge.errors import ForgeError, NodeDown, RequestRejected, UsageError
from forge.runtime.schema_check import schema_problem
from forge.runtime.prompt_bounds import OFF_LOOP_CHARS, check_text_prompt, prompt_chars_limit
from forge.functions.api import GenerateParams, Generation
from forge.runtime.admission import AdmissionRuntime
from forge.stats import BrokerStats, EngineStats

log = logging.getLogger("forge.node")
# An engine's error result starting with this is a refusal (the request cannot be run as asked), not a failure.
REFUSED = "refused: "
HEALTH_CHECK_S = 0.25
NODE_DOWN_GRACE_S = 1.0      # every card unhealthy this long = the node is down


def backend_factories() -> dict[str, Any]:
    from forge.plugins import collect

    return {args[0]: args[1] for args in collect("forge_register_backends")}


def tokenizer_key(plan: CardPlan) -> str:
    """Engines whose tokenizer comes from the same place share one tokenization of each prompt."""
    art = plan.contract.artifact
    return str(plan.contract.resolve(art.tokenizer or art.checkpoint or art.engine_dir))


def geometry_of(plan: CardPlan) -> EngineGeometry:
    lim = plan.contract.limits
    return EngineGeometry(engine_id=plan.card_id, tokenizer_key=tokenizer_key(plan),
                          max_batch_size=lim.max_batch_size, max_num_tokens=lim.max_num_tokens,
                          max_input_len=lim.max_input_len, max_output_len=lim.max_output_len,
                          tokens_per_block=plan.contract.kv_cache.tokens_per_block,
                          kv_blocks_total=plan.num_blocks)


@dataclass(eq=False)
class NodePayload:
    """A request's options as the admission runtime reads them (by attribute name, see runtime/options.py), plus
    `abandoned`: the caller stopped waiting, so admission drops the request instead of starting it."""

    sampling: Sampling
    guide: Optional[Guide] = None
    want_hidden: bool = False
    deadline_s: Optional[float] = None
    abandoned: bool = False


def guide_of(params: GenerateParams) -> Optional[Guide]:
    if params.choice is None and params.json_schema is None:
        return None
    return Guide(choice=tuple(params.choice) if params.choice is not None else None, json_schema=params.json_schema)


def guided_output_problem(text: str, guide: Guide) -> Optional[str]:
    """Why a guided output does not honour its guide, or None. Engines guarantee it by construction; this check
    makes sure nothing unparseable is ever handed out, whatever the backend."""
    if guide.choice is not None:
        return None if text in guide.choice else f"{text[:80]!r} is not one of the choices"
    if guide.json_schema is not None:
        import jsonschema

        try:
            value = json.loads(text)
        except ValueError as e:
            return f"the output is not JSON ({e})"
        err = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(guide.json_schema)(
            guide.json_schema).iter_errors(value))
        return None if err is None else f"the output does not match the schema: {err.message}"
    return None


class NodeRuntime:
    def __init__(self, loaded: LoadedNode, *, grouping: bool = True,
                 stall_window_s: float = constants.STALL_WINDOW_S, card_transport: str = "thread"):
        if card_transport != "thread":      # "process" (one worker process per card) lands with issue 14 items 1-3
            raise UsageError(f"card_transport {card_transport!r}: this build runs engines in the node's process only "
                             "(\"thread\")")
        self.loaded = loaded
        self.name = loaded.node.node
        self.plans = list(loaded.plans)
        self.grouping = grouping
        self.stall_window_s = stall_window_s
        self.engines: dict[str, Engine] = {}
        self.runtimes: dict[str, AdmissionRuntime] = {}
        self.tokenizers: dict[str, Any] = {}          # tokenizer_key -> tokenizer
        self.prompt_chars_limit = 0                   # longer text prompts fit no card (prompt_bounds.py)
        self.broker: Optional[Broker] = None
        self._futures: dict[str, tuple[asyncio.Future, int]] = {}   # request_id -> (future, prompt length)
        # Request ids: a random per-node prefix + a counter. uuid4 per request cost ~9 % of the control plane's CPU
        # (one urandom syscall each; forge bench control-plane, docs/benchmarks.md).
        self._rid_prefix, self._rid_seq = uuid.uuid4().hex[:12], itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.abandoned = 0                               # requests whose caller stopped waiting (cancelled)
        self.started_at = 0.0
        self.closed = False
        self.down: Optional[str] = None               # why no engine can work any more

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load every card's engine (in parallel threads) with exactly its contract, then start admission."""
        self._loop = asyncio.get_running_loop()
        factories = backend_factories()
        for p in self.plans:
            if p.contract.backend not in factories:
                raise ForgeError(f"card {p.card_id}: backend {p.contract.backend!r} is not installed "
                                 f"(known: {', '.join(sorted(factories))})")
        t0 = time.monotonic()

        async def load(p: CardPlan) -> Engine:
            factory = factories[p.contract.backend]
            return await asyncio.wait_for(asyncio.to_thread(factory, p.contract, p),
                                          constants.ENGINE_START_TIMEOUT_S)

        engines = await asyncio.gather(*(load(p) for p in self.plans), return_exceptions=True)
        failed = [(p, e) for p, e in zip(self.plans, engines) if isinstance(e, BaseException)]
        if failed:
            for e in engines:
                if isinstance(e, Engine):
                    e.shutdown(constants.ENGINE_SHUTDOWN_TIMEOUT_S)
            p, e = failed[0]
            if isinstance(e, ForgeError):
                raise e
            raise ForgeError(f"card {p.card_id} ({p.contract.contract}): engine failed to start: "
                             f"{type(e).__name__}: {e}") from e
        geoms = [geometry_of(p) for p in self.plans]
        self.broker = Broker(BrokerCore(geoms, grouping=self.grouping, node=self.name))
        for p, eng, g in zip(self.plans, engines, geoms):
            self.engines[p.card_id] = eng
            self.tokenizers.setdefault(g.tokenizer_key, eng.tokenizer)
            rt = AdmissionRuntime(engine=eng, plan=p, broker=self.broker, node=self.name,
                                  deliver=self._deliverer(p.card_id), stall_window_s=self.stall_window_s,
                                  tokenizer_key=g.tokenizer_key)
            self.runtimes[p.card_id] = rt
            self._tasks.append(asyncio.create_task(rt.run(), name=f"admission-{p.card_id}"))
        self._tasks.append(asyncio.create_task(self._watch_health(), name="node-health"))
        self.prompt_chars_limit = prompt_chars_limit((g.max_input_len, self.tokenizers[g.tokenizer_key])
                                                     for g in geoms)
        self.started_at = time.time()
        log.info("node %s: %d engine(s) up in %.1f s", self.name, len(self.engines), time.monotonic() - t0)

    async def drain(self, timeout_s: float) -> bool:
        """Stop accepting, let in-flight work finish (bounded). True when nothing was left behind."""
        self.closed = True
        if self.broker is not None:
            self.broker.close()
        oks = await asyncio.gather(*(rt.drain(timeout_s) for rt in self.runtimes.values()))
        return all(oks)

    async def stop(self) -> None:
        self.closed = True
        if self.broker is not None:
            self.broker.close()
        await asyncio.gather(*(rt.stop() for rt in self.runtimes.values()), return_exceptions=True)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for fut, _ in self._futures.values():
            if not fut.done():
                fut.set_exception(ForgeError(f"node {self.name} stopped before the request finished"))
        self._futures.clear()

    async def _watch_health(self) -> None:
        """When every card has failed or is wedged, fail what waits on them: nothing would ever answer."""
        unhealthy_since: Optional[float] = None
        while not self.closed:
            await asyncio.sleep(HEALTH_CHECK_S)
            if any(rt.stats().healthy for rt in self.runtimes.values()):
                unhealthy_since = None
                continue
            unhealthy_since = unhealthy_since or time.monotonic()
            if time.monotonic() - unhealthy_since >= NODE_DOWN_GRACE_S:
                self._node_down("; ".join(f"{cid}: {rt.failure or rt.state}" for cid, rt in self.runtimes.items()))
                return

    def _node_down(self, reason: str) -> None:
        self.down = f"node {self.name}: no engine can work ({reason})"
        log.error(self.down)
        for fut, _ in list(self._futures.values()):
            if not fut.done():
                fut.set_exception(NodeDown(self.down))

    # ------------------------------------------------------------------ requests
    def healthy_cards(self) -> list[str]:
        return [cid for cid, rt in self.runtimes.items() if rt.stats().healthy]

    def encode(self, prompt: str | Sequence[int]) -> dict[str, tuple[int, ...]]:
        if isinstance(prompt, str):
            return {k: tuple(t.encode(prompt)) for k, t in self.tokenizers.items()}
        ids = tuple(map(int, prompt))
        return {k: ids for k in self.tokenizers}

    async def generate(self, prompt: str | Sequence[int], params: GenerateParams) -> Generation:
        return (await self.submit(prompt, params))[0]

    async def embed(self, prompt: str | Sequence[int]) -> list[float]:
        gen, result = await self.submit(prompt, GenerateParams(max_tokens=1, embed=True))
        if result.hidden is None:
            raise ForgeError(f"card {gen.card}: its backend returns no hidden state")
        return list(result.hidden)

    async def submit(self, prompt: str | Sequence[int], params: GenerateParams, *,
                     wait: bool = True) -> tuple[Generation, EngineResult]:
        """Tokenize, hand to the broker, and wait for the engine's result. A full broker is waited out (wait=True)
        or refused at once with QueueFull (wait=False: the online path answers 429). Cancelling the caller (a
        client gone, a deadline) takes the request back: dropped if still queued, cancelled in its engine if not."""
        if self.down:
            raise NodeDown(self.down)
        if self.closed or self.broker is None:
            raise RequestRejected(f"node {self.name} is not accepting requests")
        if params.max_tokens <= 0:
            raise RequestRejected(f"max_tokens must be positive, got {params.max_tokens}")
        guide = guide_of(params)
        if guide is not None:
            self._check_guide_support(guide)
        if isinstance(prompt, str):
            check_text_prompt(prompt, self.prompt_chars_limit, self.name)
        prompts = await asyncio.to_thread(self.encode, prompt) if isinstance(prompt, str) and \
            len(prompt) > OFF_LOOP_CHARS else self.encode(prompt)
        rid = f"{self._rid_prefix}{next(self._rid_seq):x}"
        payload = NodePayload(sampling=Sampling(temperature=params.temperature, top_p=params.top_p,
                                                top_k=params.top_k, seed=params.seed),
                              guide=guide, want_hidden=params.embed, deadline_s=params.deadline_s)
        req = BrokerRequest(request_id=rid, prompts=prompts, max_new_tokens=params.max_tokens, payload=payload,
                            priority=params.priority)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        n_in = len(next(iter(prompts.values()))) if prompts else 0
        self._futures[rid] = (fut, n_in)
        try:
            if wait:
                await self.broker.put(req)
            else:
                self.broker.put_nowait(req)
        except NoEngineFits as e:
            self._futures.pop(rid, None)
            raise RequestRejected(str(e)) from None
        except BaseException:
            self._futures.pop(rid, None)
            raise
        try:
            card, result = await fut
        except BaseException:
            self._abandon(req)
            raise
        finally:
            self._futures.pop(rid, None)
        if result.finish_reason == "error" or result.error:
            why = result.error or "engine error"
            if why.startswith(REFUSED):     # the engine could not take it as asked: the caller's to fix
                raise RequestRejected(f"card {card}: {why[len(REFUSED):]}")
            raise ForgeError(f"card {card}: {why}")
        if result.finish_reason == "cancelled":
            raise ForgeError(f"card {card}: the request was cancelled")
        key = self.runtimes[card].geometry.tokenizer_key
        text = "" if params.embed else self.tokenizers[key].decode(result.output_ids)
        if guide is not None:
            problem = guided_output_problem(text, guide)
            if problem is not None:
                raise ForgeError(f"card {card}: guided output failed its check: {problem}")
        gen = Generation(text=text, output_tokens=len(result.output_ids), input_tokens=len(req.prompt_for(key)),
                         finish_reason=result.finish_reason, card=card, token_ids=tuple(result.output_ids))
        return gen, result

    def _check_guide_support(self, guide: Guide) -> None:
        if guide.choice is not None and guide.json_schema is not None:
            raise RequestRejected("give choice or json_schema, not both")
        kind = "choice" if guide.choice is not None else "json_schema"
        if not any(kind in e.supports_guides for e in self.engines.values()):
            have = ", ".join(f"{cid}: {sorted(e.supports_guides) or 'none'}" for cid, e in self.engines.items())
            raise RequestRejected(f"no card on node {self.name} supports guided output of kind {kind} ({have})")
        problem = schema_problem(guide.json_schema) if guide.json_schema is not None else None
        if problem:
            raise RequestRejected(problem)

    def _abandon(self, req: BrokerRequest) -> None:
        """The caller stopped waiting: admission drops the request if it is still queued; the runtime that holds
        it cancels it in its engine (its KV reservation lasts until the engine lets go)."""
        req.payload.abandoned = True
        self.abandoned += 1
        for rt in self.runtimes.values():
            if rt.cancel(req.request_id):
                break

    def open_requests(self) -> int:
        """Callers waiting for a result (queued or in an engine)."""
        return len(self._futures)

    def _deliverer(self, card: str):
        def deliver(req: BrokerRequest, result: EngineResult) -> None:
            entry = self._futures.get(req.request_id)
            if entry is None:
                return  # caller gave up (cancelled); nothing to hand back
            fut = entry[0]

            def settle() -> None:
                if not fut.done():
                    fut.set_result((card, result))

            loop = self._loop
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                settle()
            elif loop is not None:
                loop.call_soon_threadsafe(settle)
        return deliver

    # ------------------------------------------------------------------ observation
    def engine_stats(self) -> list[EngineStats]:
        return [rt.stats() for rt in self.runtimes.values()]

    def broker_stats(self) -> BrokerStats:
        return self.broker.stats() if self.broker else BrokerStats(node=self.name)

    def describe(self) -> dict:
        cards = []
        for p in self.plans:
            st = self.runtimes[p.card_id].stats() if p.card_id in self.runtimes else None
            cards.append({"card": p.card_id, "model": p.card.model, "tier": p.contract.contract,
                          "backend": p.contract.backend, "healthy": bool(st and st.healthy),
                          "limits": p.contract.limits.model_dump(), "kv_blocks": p.num_blocks,
                          "full_length_slots": p.full_length_slots,
                          "state": self.runtimes[p.card_id].state if p.card_id in self.runtimes else "absent",
                          "failure": self.runtimes[p.card_id].failure if p.card_id in self.runtimes else None,
                          "in_flight": st.in_flight if st else 0,
                          "kv_blocks_reserved": st.kv_blocks_reserved if st else 0,
                          "guides": sorted(self.engines[p.card_id].supports_guides) if p.card_id in self.engines else [],
                          "tokens_per_s": round(st.tokens_per_s, 1) if st else 0.0})
        return {"node": self.name, "started_at": self.started_at, "cards": cards,
                "pending": self.broker.pending() if self.broker else 0, "closed": self.closed,
                "open_requests": self.open_requests(), "abandoned": self.abandoned,
                "down": self.down}


def provision_and_serve(loaded: LoadedNode, **options) -> int:
    """`forge provision` without --dry-run (see forge/runtime/serve.py)."""
    from forge.runtime.serve import provision_and_serve as serve

    return serve(loaded, **options)
