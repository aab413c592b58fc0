"""TransformersEngine: forge's Engine interface over transformers' ContinuousBatchingManager.

The manager runs its generation loop in its own thread. Requests are added without streaming, as
transformers' own API runs them: the loop hands over one output per request, when it ends (streaming
would have the loop build and queue an output for every running request at every step, and this
engine's poll take each of them, all under the GIL the loop is bound by: measured in
docs/benchmarks.md, "forge ÷ direct on one card"). Token progress (the runtime's liveness signal) is
read from the loop's request states at most every LIVE_COUNT_S, and a cancelled request's tokens so
far from its state. The manager's id for a request is its id as text (`str(request_id)`,
forge/engines/interface.py): an engine host never sends one id twice (its RequestKey carries the
attempt), so a cancelled request never meets a later copy of itself inside the manager (which drains
new requests before cancellations). The manager gives no result for a cancelled request, so cancel
answers it here at once.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Optional, Sequence

from forge.config.plan import CardPlan
from forge.engines.transformers import requests as reqs
from forge.engines.transformers.cache_stats import count_prefix_hits, kv_blocks
from forge.engines.transformers.hidden import HiddenWorker
from forge.engines.transformers.sizing import capacity_of
from forge.engines.interface import (
    REFUSED,
    Engine,
    EngineBusy,
    EngineFailed,
    EngineRequest,
    EngineResult,
    IterationStats,
    Progress,
)

log = logging.getLogger("forge.engines.transformers")

_SLICE_S = 0.01       # poll waits in slices this long, so hidden-state results wake it as well
_DRAIN_LIMIT = 65536  # outputs taken by one poll at most: bounded work per call
LIVE_COUNT_S = 0.1    # running requests' token counts are read this often (liveness, not results)


@dataclass
class _Pending:
    request: EngineRequest
    internal_id: str                                   # the manager's id: str(request.request_id)
    # generated (from the final output, or read at a cancel)
    tokens: list[int] = field(default_factory=list)
    counted: int = 0                                   # tokens already reported as progress
    generating: bool = False                           # handed to the manager and not finished
    hidden: Optional[list[float]] = None
    error: Optional[str] = None
    cancelled: bool = False
    guide: Any = None  # per-request guide state (forge/engines/transformers/guided.py)

    def complete(self) -> bool:
        if self.error is not None:
            return True
        return not self.generating and (not self.request.want_hidden or self.hidden is not None)


class TransformersEngine(Engine):
    name = "transformers"
    supports_hidden = True
    # set per instance from the guide support it was built with
    supports_guides: frozenset[str] = frozenset()
    # the cache registers a block after the forward that completed it and looks a request's prefix
    # up when it first schedules it: requests of one prefix that start together all compute it
    # (forge/broker/warming.py)
    shares_prefix_within_step = False

    def __init__(
        self,
        plan: CardPlan,
        section,
        model,
        tokenizer,
        manager,
        *,
        device: str,
        eos,
        info: dict[str, Any],
        guides=None,
        no_guides_why: str = "",
        seeds=None,
    ):
        self.plan, self.section, self.model, self.tokenizer = plan, section, model, tokenizer
        self._manager = manager
        self._device = device
        lim = plan.contract.limits
        self._guides = guides                      # (GuideCompiler, GuideProcessor) or None
        self.supports_guides = guides[0].kinds if guides is not None else frozenset()
        self._limits = dict(
            max_input_len=lim.max_input_len,
            max_output_len=lim.max_output_len,
            vocab_size=plan.contract.model.vocab_size,
            sampling_mode=section.sampling,
            guides=self.supports_guides,
            no_guides_why=no_guides_why,
            seeds=seeds is not None,
        )
        self._seeds = seeds  # SeededSampler (forge/engines/transformers/seeded.py) or None
        eos_ids = eos if isinstance(eos, (list, tuple)) else [eos]
        self._eos_set = {int(e) for e in eos_ids if e is not None and int(e) >= 0}
        self._eos_arg = (
            sorted(self._eos_set) if len(self._eos_set) > 1 else (next(iter(self._eos_set), -1))
        )
        self._capacity = capacity_of(plan, section)
        self._lock = threading.Lock()
        self._pending: dict[Hashable, _Pending] = {}       # request id -> its entry
        self._by_internal: dict[str, Hashable] = {}        # the manager's id -> request id
        self._ready: deque[EngineResult] = deque()
        self._partials: list = []  # (request_id, ids so far) of streamed requests that grew
        self._failure: Optional[str] = None
        self._closed = False
        self._prefix_hits = 0
        self._live_counted_at = 0.0
        self._info = dict(info, capacity=self._capacity, hidden_pooling=section.hidden_pooling,
                          guides=sorted(self.supports_guides) or no_guides_why)
        self._hidden = HiddenWorker(model, device, section.hidden_pooling, maxsize=self._capacity)
        count_prefix_hits(manager.batch_processor.cache, self._add_prefix_hits)

    # ------------------------------------------------------------------ the five calls
    def submit(self, requests: Sequence[EngineRequest]) -> None:
        """All or nothing: either every request is taken (refused ones come back as error results)
        or EngineBusy."""
        self._raise_if_dead()
        batch = list(requests)
        with self._lock:
            ids = [r.request_id for r in batch]
            if len(set(ids)) != len(ids) or any(i in self._pending for i in ids):
                raise ValueError("request ids already in flight on this engine: "
                                 f"{sorted(set(ids) & set(self._pending)) or ids}")
            if len(self._pending) + len(batch) > self._capacity:
                raise EngineBusy(f"engine holds {len(self._pending)} requests; capacity "
                                 f"{self._capacity}")
            queue = self._manager.input_queue
            if queue.maxsize and queue.qsize() + len(batch) > queue.maxsize:
                raise EngineBusy("the manager's input queue is full")
            for req in batch:
                self._accept(req)

    def poll(self, timeout_s: float) -> Progress:
        deadline = time.monotonic() + max(float(timeout_s), 0.0)
        new_tokens = 0
        while True:
            self._raise_if_closed_or_failed()
            outputs = self._take_outputs(min(_SLICE_S, max(deadline - time.monotonic(), 0.0)))
            hidden = self._hidden.drain(_DRAIN_LIMIT)
            dead = self._loop_dead()
            with self._lock:
                for out in outputs:
                    new_tokens += self._on_output(out, dead is not None)
                for key, vec, err in hidden:
                    self._on_hidden(key, vec, err)
                now = time.monotonic()
                if now - self._live_counted_at >= LIVE_COUNT_S:
                    self._live_counted_at = now
                    new_tokens += self._count_running()
                results = list(self._ready)
                self._ready.clear()
                partials, self._partials = self._partials, []
            if dead is not None:
                self._failure = dead      # finished results still go out; the next call raises
                if not results:
                    raise EngineFailed(dead)
            if results or partials or time.monotonic() >= deadline:
                return Progress(results=results, new_tokens=new_tokens, partials=partials)

    def cancel(self, request_id: Hashable) -> None:
        with self._lock:
            entry = self._pending.pop(request_id, None)
            if entry is None:
                return  # finished (its result is out or queued) or unknown: nothing to stop
            self._by_internal.pop(entry.internal_id, None)
            self._unguide(entry)
            entry.cancelled = True
            if entry.generating:
                entry.tokens = self._tokens_so_far(entry)
                self._manager.cancel_request(entry.internal_id)
            self._ready.append(EngineResult(request_id, list(entry.tokens), "cancelled"))

    def stats(self) -> IterationStats:
        m = self._manager
        st = IterationStats(
            steps=int(getattr(m, "current_batch", 0) or 0),
            prefix_hit_tokens=self._prefix_hits,
            queued=self._hidden.pending(),
        )
        bp = m.batch_processor
        if bp is None:
            return st
        try:   # read-only snapshot of the loop thread's state; len() of its dicts is atomic
            st.active = len(bp.scheduler.active_requests)
            st.queued += len(bp.scheduler.waiting_requests) + m.input_queue.qsize()
            st.kv_blocks_free, st.kv_blocks_used = kv_blocks(bp.cache)
            st.tokens_last_step = int(getattr(bp.inputs_and_outputs, "num_q_tokens", 0) or 0)
        # the loop changed a structure while we read it: partial snapshot
        except (RuntimeError, AttributeError):
            pass
        return st

    def shutdown(self, timeout_s: float) -> None:
        """Hard stop: the loop ends after its current step; requests still held get no result (the
        runtime requeues what it had in flight). Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(float(timeout_s), 0.0)
        # stop() lets go of it; its graphs are recorded below
        processor = self._manager.batch_processor
        try:
            self._manager.stop(
                block=True, timeout=max(deadline - time.monotonic(), 0.01), hard_stop=True
            )
        # a failing stop must not keep the card: log it and carry on freeing
        except Exception as exc:
            log.warning("transformers manager stop failed: %s", exc)
        self._hidden.stop(max(deadline - time.monotonic(), 0.01))
        self._record_shapes(processor)
        if self._manager.is_running():
            log.warning(
                "transformers generation loop still running after %.1fs shutdown timeout", timeout_s
            )
        else:
            self._manager.destroy()
        with self._lock:
            for entry in self._pending.values():
                self._unguide(entry)
            self._pending.clear()
            self._by_internal.clear()
        self.model = None
        gc.collect()
        if self._device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    def _record_shapes(self, processor) -> None:
        from forge.engines.transformers import graph_shapes

        if processor is not None and graph_shapes.in_use(self.section):
            graph_shapes.record(self.plan, self.section, processor)

    # ------------------------------------------------------------------ internals
    def _accept(self, req: EngineRequest) -> None:
        """One request in. Anything about this request that fails (a check, a guide's compiler, the
        manager refusing its arguments) fails it alone with an error result; only a failure of the
        engine itself raises."""
        try:
            why = reqs.refusal(req, **self._limits)
        except Exception as exc:  # noqa: BLE001 - a request the checks cannot even read is refused, not fatal
            why = f"the request cannot be checked: {type(exc).__name__}: {str(exc)[:300]}"
        if why is not None:
            self._ready.append(EngineResult(req.request_id, [], REFUSED, error=why))
            return
        entry = _Pending(req, str(req.request_id))
        if req.guide is not None and req.max_new_tokens > 0:
            try:
                state, why = self._guides[0].start(req.guide, req.max_new_tokens)
            except Exception as exc:  # noqa: BLE001 - a guide that breaks its compiler fails its request, not the card
                state, why = (
                    None,
                    f"guided output cannot be compiled: {type(exc).__name__}: {str(exc)[:300]}",
                )
            if why is not None:
                self._ready.append(EngineResult(req.request_id, [], REFUSED, error=why))
                return
            entry.guide = state
            self._guides[1].add(entry.internal_id, state, len(req.prompt_ids), req.max_new_tokens)
        self._pending[req.request_id] = entry
        self._by_internal[entry.internal_id] = req.request_id
        if (
            self._seeds is not None
            and req.sampling.seed is not None
            and not reqs.is_greedy(req.sampling)
        ):
            self._seeds.add(entry.internal_id, req.sampling.seed)
        if req.want_hidden:
            self._hidden.submit(entry.internal_id, req.prompt_ids, lambda e=entry: e.cancelled)
        if req.max_new_tokens > 0:
            kwargs = reqs.processor_kwargs(req.sampling, sampling_mode=self.section.sampling,
                                           vocab_size=self._limits["vocab_size"])
            try:
                got = self._manager.add_request(
                    list(req.prompt_ids),
                    request_id=entry.internal_id,
                    max_new_tokens=req.max_new_tokens,
                    streaming=req.stream,
                    eos_token_id=self._eos_arg if req.sampling.stop_at_eos else -1,
                    **kwargs,
                )
            # this request's arguments, not the engine
            except (TypeError, ValueError, OverflowError) as exc:
                self._forget(entry)
                self._ready.append(EngineResult(req.request_id, [], "error",
                                                error="refused: transformers: "
                                                      f"{type(exc).__name__}: {exc}"))
                return
            if got is None:   # the manager refuses work only when its loop is stopping or dead
                self._unguide(entry)
                self._failure = (
                    self._loop_dead() or "transformers generation loop is not accepting requests"
                )
                raise EngineFailed(self._failure)
            entry.generating = True
        self._finish_if_complete(entry)

    def _forget(self, entry: _Pending) -> None:
        self._pending.pop(entry.request.request_id, None)
        self._by_internal.pop(entry.internal_id, None)
        self._unguide(entry)
        entry.cancelled = True      # a hidden-state job already queued for it is dropped

    def _take_outputs(self, wait_s: float) -> list:
        started = time.monotonic()
        first = self._manager.get_result(timeout=wait_s)
        if first is None:
            # get_result returns at once when the loop is gone; keep the wait bounded but not a busy
            # spin
            rest = wait_s - (time.monotonic() - started)
            if rest > 0:
                time.sleep(rest)
            return []
        outs = [first]
        while len(outs) < _DRAIN_LIMIT:
            nxt = self._manager.get_result(timeout=0)
            if nxt is None:
                break
            outs.append(nxt)
        return outs

    def _on_output(self, out, loop_dead: bool) -> int:
        ext = self._by_internal.get(out.request_id)
        if ext is None:
            return 0                      # cancelled (already answered) or from before a cancel
        entry = self._pending[ext]
        tokens = out.generated_tokens
        new = max(len(tokens) - entry.counted, 0)
        entry.counted = max(entry.counted, len(tokens))
        entry.tokens = list(tokens)
        if out.is_finished():
            if out.error is not None:
                if loop_dead:
                    # a victim of the dead loop: EngineFailed tells the runtime to requeue it
                    return new
                entry.error = f"transformers: {out.error}"
            entry.generating = False
            self._finish_if_complete(entry)
        # a streamed request's step: its manager sends these each step
        elif entry.request.stream and new:
            self._partials.append((ext, list(tokens)))
        return new

    def _running_states(self) -> list:
        """The loop's states of the requests it holds (a copy of its dicts' values: atomic under the
        GIL)."""
        bp = self._manager.batch_processor
        if bp is None:
            return []
        try:
            sch = bp.scheduler
            return list(sch.active_requests.values()) + list(sch.waiting_requests.values())
        # the loop replaced a structure while we read it: next time
        except (RuntimeError, AttributeError):
            return []

    def _count_running(self) -> int:
        """Tokens the running requests generated since they were last counted (under self._lock)."""
        new = 0
        for state in self._running_states():
            ext = self._by_internal.get(state.request_id)
            entry = self._pending.get(ext) if ext is not None else None
            if entry is not None:
                n = state.generated_len()
                if n > entry.counted:
                    new += n - entry.counted
                    entry.counted = n
        return new

    def _tokens_so_far(self, entry: _Pending) -> list[int]:
        for state in self._running_states():
            if state.request_id == entry.internal_id:
                return list(state.to_generation_output().generated_tokens)
        return list(entry.tokens)

    def _on_hidden(self, key: str, vec: Optional[list[float]], err: Optional[str]) -> None:
        ext = self._by_internal.get(key)
        if ext is None:
            return
        entry = self._pending[ext]
        if err is not None:
            entry.error = f"hidden state: {err}"
        else:
            entry.hidden = vec
        self._finish_if_complete(entry)

    def _finish_if_complete(self, entry: _Pending) -> None:
        if not entry.complete():
            return
        rid = entry.request.request_id
        self._pending.pop(rid, None)
        self._by_internal.pop(entry.internal_id, None)
        self._unguide(entry)
        if entry.error is not None:
            if entry.generating:
                self._manager.cancel_request(entry.internal_id)
            self._ready.append(EngineResult(rid, list(entry.tokens), "error", error=entry.error))
            return
        tokens, reason = list(entry.tokens), "length"
        if entry.request.sampling.stop_at_eos and tokens and tokens[-1] in self._eos_set:
            # output_ids carry text tokens only; the reason says it ended
            tokens, reason = tokens[:-1], "eos"
        if entry.guide is not None:
            # the guide's own check: never hand out output it did not complete
            why = entry.guide.finish(tokens)
            if why is not None and entry.error is None and reason == "length":
                # max_tokens ran out before the guide could complete (a schema whose shortest answer
                # the up-front search could not bound): the caller's budget, refused as asked (HTTP
                # 400), not a failure
                self._ready.append(EngineResult(rid, tokens, REFUSED, error=(
                    f"max_tokens {entry.request.max_new_tokens} ran out before the guided output "
                    f"was complete ({why}); raise "
                    "max_tokens or give a schema with a shorter answer")))
                return
            if why is not None:
                self._ready.append(
                    EngineResult(rid, tokens, "error", error=f"guided output: {why}")
                )
                return
        self._ready.append(EngineResult(rid, tokens, reason, hidden=entry.hidden))

    def _unguide(self, entry: _Pending) -> None:
        """Forget the request's per-request processor state (its guide, its seed)."""
        if entry.guide is not None and self._guides is not None:
            self._guides[1].remove(entry.internal_id)
        if self._seeds is not None:
            self._seeds.remove(entry.internal_id)

    def _loop_dead(self) -> Optional[str]:
        if self._closed:
            return None
        status = self._manager.background_thread_status
        err = status.fatal_error
        if err is not None:
            return f"transformers generation loop died: {type(err).__name__}: {err}"
        if status.local_status >= status.HARD_STOP or not self._manager.is_running():
            return "transformers generation loop stopped"
        return None

    def _raise_if_closed_or_failed(self) -> None:
        if self._closed:
            raise EngineFailed("engine is shut down")
        if self._failure is not None:
            raise EngineFailed(self._failure)

    def _raise_if_dead(self) -> None:
        self._raise_if_closed_or_failed()
        dead = self._loop_dead()
        if dead is not None:
            self._failure = dead
            raise EngineFailed(dead)

    def _add_prefix_hits(self, n: int) -> None:
        self._prefix_hits += n
