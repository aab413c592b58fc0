"""VllmEngine: forge's Engine interface over vLLM's synchronous v1 `LLMEngine`, its engine core in
this process.

Why the sync LLMEngine and not AsyncLLM. forge drives every engine from one thread with bounded
calls (submit, poll(timeout), cancel, stats, shutdown: forge/host/driver.py), which is exactly the
shape of LLMEngine: `add_request`, `step` (one scheduler iteration: schedule, one forward pass, the
requests it ended), `abort_request`. poll steps the engine until a request finishes or its timeout
passes; a step, bounded by the contract's token budget, is the unit of work, so no call waits on
anything but one step. AsyncLLM would add an asyncio loop in a thread of its own, an output-handler
task and its queues between that loop and forge's driver, and it always runs the engine core in a
second process (AsyncMPClient), reached over ZMQ.

Why the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"). forge
already gives each engine a process of its own, the card worker (`python -m forge.host`), and kills
or restarts it as a unit. A core process spawned by vLLM would be a grandchild of the node: a
SIGKILLed card worker cannot take it down, so it would live on holding the card's memory (vLLM sets
no parent-death signal). In process there is nothing to orphan, nothing is spawned (no main guard is
needed in user scripts), and no step's outputs cross a socket. The cost: the scheduler's Python and
the forward share this process with the worker's event loop, as transformers' loop does.

Stop strings are applied by forge to the finished text (forge/requests/stops.py), as for every
backend; the engine runs each request to EOS or its max_new_tokens. Embeddings need a pooling
runner; a generation tier refuses them.

Guides: a choice is guided by forge's token trie (forge/engines/vllm/choice.py), the same guide as
on transformers, never by vLLM's character-level `choice` grammar; JSON schemas and regexes by the
tier's structured-output backend. A request vLLM refuses at add_request (a schema its backend cannot
compile: VLLMValidationError, which is no ValueError) is that request's REFUSED result, never the
engine's failure.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Hashable, Optional, Sequence

from forge.config.plan import CardPlan
from forge.engines.interface import (
    REFUSED,
    Engine,
    EngineBusy,
    EngineFailed,
    EngineRequest,
    EngineResult,
    IterationStats,
    Progress,
    sampling_problem,
)
from forge.engines.choice_trie import ChoiceTrie, budget_problem, encode_choices
from forge.engines.vllm import mapping, seeded
from forge.engines.vllm.choice import extra_args as choice_extra_args
from forge.engines.vllm.choice import spelling_bound

log = logging.getLogger("forge.engines.vllm")

FINISH_REASONS = {"stop": "eos", "length": "length", "abort": "cancelled", "error": "error"}
CHOICE_CACHE_ENTRIES = 256  # choice lists' tries kept (a bulk job repeats one)
# Who draws a seeded request's tokens (factory.py decides per card): vLLM's per-request generator
# (CUDA), forge's logits processor (forge/engines/vllm/seeded.py: vLLM's CPU generator cannot be
# wound back), or nobody (refused)
SEEDS_BY_VLLM, SEEDS_BY_FORGE, SEEDS_REFUSED = "vllm", "forge", "refused"
SEED_REFUSAL = ("a per-request seed cannot be honoured on this card: vLLM's CPU platform fails a "
                "seeded request "
                "whose prompt is split across steps, and this vLLM has no logits-processor adapter "
                "for forge's "
                "seeded sampler; leave seed unset or use temperature 0")
EMBED_REFUSAL = ("embed needs a pooling tier (vLLM runner 'pooling'); backend vllm runs this tier "
                 "for generation "
                 "only")


@dataclass
class _Live:
    request: EngineRequest
    external_id: str                                   # what vLLM was given: str(request id)
    internal_id: str                                   # vLLM's own id for it (aborts take this one)


class StepStats:
    """What vLLM's stat loggers see each step, kept for stats(): running, waiting, KV use, prefix
    hits, preemptions. Written by the thread that steps the engine, read by the same thread (the
    driver): no lock needed, but one is cheap and keeps a stats() from another thread consistent."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._lock = threading.Lock()
        self.running = self.waiting = self.kv_used = 0
        self.prefix_hit_tokens = self.preemptions = self.steps = self.tokens_last_step = 0
        self.generated = 0  # tokens sampled, cumulative: the poll's token progress

    def record(self, scheduler_stats, iteration_stats) -> None:
        with self._lock:
            if scheduler_stats is not None:
                self.running = int(scheduler_stats.num_running_reqs)
                self.waiting = int(
                    scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
                )
                self.kv_used = round(float(scheduler_stats.kv_cache_usage) * self.num_blocks)
                self.prefix_hit_tokens += int(scheduler_stats.prefix_cache_stats.hits)
            if iteration_stats is not None:
                self.preemptions += int(iteration_stats.num_preempted_reqs)
                self.tokens_last_step = int(
                    iteration_stats.num_generation_tokens + iteration_stats.num_prompt_tokens
                )
                self.generated += int(iteration_stats.num_generation_tokens)

    def snapshot(self) -> IterationStats:
        with self._lock:
            return IterationStats(
                active=self.running,
                queued=self.waiting,
                kv_blocks_used=self.kv_used,
                kv_blocks_free=max(self.num_blocks - self.kv_used, 0),
                tokens_last_step=self.tokens_last_step,
                steps=self.steps,
                prefix_hit_tokens=self.prefix_hit_tokens,
                preemptions=self.preemptions,
            )


def stat_logger_class(sink: StepStats):
    """The vLLM stat logger class that hands every step's stats to `sink`, in place of vLLM's
    Prometheus logger.

    vLLM adds its PrometheusStatLogger to the loggers it is given unless one of them is of that
    class. forge's metrics are its own (forge/metrics.py), so nothing reads vLLM's registry in a
    card worker, yet vLLM's logger would set some 20 series every step and observe each token's
    latency and each finished request's ~10 histograms, on the engine's thread (0.9 % of its
    samples: docs/benchmarks.md, "vLLM on the CPU"). This class is of PrometheusStatLogger's kind
    without building its metrics."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class ForgeStatLogger(PrometheusStatLogger):
        # no super().__init__: no Prometheus series
        def __init__(self, vllm_config, engine_indexes=None):
            self.vllm_config = vllm_config
            self.engine_indexes = list(engine_indexes or [0])

        def record(
            self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0
        ):
            sink.record(scheduler_stats, iteration_stats)

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0):
            pass

        def log_engine_initialized(self):
            pass

        def log(self):
            pass

    return ForgeStatLogger


class VllmEngine(Engine):
    name = mapping.BACKEND
    supports_hidden = False
    supports_guides = frozenset({"choice", "json_schema", "regex"})
    # vLLM mixes prefill into decode steps without padding: output cohorts gain it nothing, while
    # serving longest first across prefix groups scatters a group's requests until its blocks are
    # evicted (docs/benchmarks.md, "vLLM on the CPU": prefix reuse 71 % -> 85 %, broker / FIFO
    # 0.92-1.06 -> 1.27-1.37 on prefix-heavy-cpu)
    output_classes_first = False
    # vLLM schedules its waiting queue into the step in which a slot frees: forge keeps it
    # max_batch_size deep (docs/benchmarks.md, "vLLM on the CPU": forge's engine ran dry 4 % of the
    # window without it)
    queues_beyond_slots = True

    def __init__(self, plan: CardPlan, llm_engine, tokenizer, sink: StepStats, info: dict[str, Any],
                 eos: Sequence[int] = (), trie_choices: bool = True, seeds: str = SEEDS_BY_VLLM):
        self.plan, self.tokenizer, self._engine, self._sink, self._info = (
            plan,
            tokenizer,
            llm_engine,
            sink,
            info,
        )
        self._eos = [int(e) for e in eos]  # what vLLM stops at: the choice guide ends with one
        self._tries: dict[str, Any] = {}   # choice list (JSON) -> ChoiceTrie or why it cannot guide
        self._trie_choices = trie_choices  # False: vLLM without the adapter (0.34): its grammar
        self._seeds = seeds                # SEEDS_BY_VLLM / SEEDS_BY_FORGE / SEEDS_REFUSED
        lim = plan.contract.limits
        self._lim = lim
        self._capacity = 2 * lim.max_batch_size  # held at most: the slots and one more batch
        self._live: dict[str, _Live] = {}  # the id vLLM was given (and reports) -> the request
        self._by_request: dict[Hashable, str] = {}  # forge's request id -> the id vLLM was given
        self._ready: list[EngineResult] = []  # answered without a step (refused, cancelled)
        self._closed = False
        self._failed: Optional[str] = None
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        self._SamplingParams, self._prompt, self._refused_by_vllm = (
            SamplingParams,
            tokens_prompt(),
            request_errors(),
        )
        self._FINAL_ONLY, self._Guide = RequestOutputKind.FINAL_ONLY, StructuredOutputsParams
        self._CUMULATIVE = RequestOutputKind.CUMULATIVE  # a streamed request's outputs, every step

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    # ------------------------------------------------------------------ Engine
    def submit(self, requests: Sequence[EngineRequest]) -> None:
        """All or nothing: every request is taken (refused ones come back as REFUSED results) or
        EngineBusy."""
        self._raise_if_unusable()
        if len(self._live) + len(requests) > self._capacity:
            raise EngineBusy(f"engine holds {len(self._live)} requests; capacity {self._capacity}")
        for r in requests:
            if r.request_id in self._by_request:
                raise ValueError(f"request {r.request_id!r} is already in the engine")
        for r in requests:
            why = self._refusal(r)
            params = None
            if why is None:
                params, why = self._params(r)
            if why is not None:
                self._ready.append(EngineResult(r.request_id, [], REFUSED, error=why))
                continue
            # the key's text (forge/engines/interface.py), never rewritten
            external = str(r.request_id)
            try:
                internal = self._engine.add_request(
                    external, self._prompt(list(r.prompt_ids)), params, priority=-r.priority
                )   # vLLM: lower first
            # vLLM's own validation (a schema its backend cannot compile, ...)
            except self._refused_by_vllm as exc:
                self._ready.append(EngineResult(r.request_id, [], REFUSED, error="vLLM refused "
                                                                                 "the request: "
                                                f"{' '.join(str(exc).split())[:300]}"))
                continue
            self._live[external] = _Live(r, external, internal)
            self._by_request[r.request_id] = external

    def poll(self, timeout_s: float) -> Progress:
        """Steps the engine until a request finishes or `timeout_s` passes (a step begun before then
        runs to its end); token progress of every step is reported."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        out = Progress(results=self._ready)
        self._ready = []
        while not out.results and not out.partials and self._live and not self._closed:
            self._step(out)
            if time.monotonic() >= deadline:
                break
        if not out.results and not self._live and not self._closed:
            # idle: nothing to step
            time.sleep(max(0.0, min(deadline - time.monotonic(), timeout_s)))
        return out

    def cancel(self, request_id: Hashable) -> None:
        external = self._by_request.get(request_id)
        if external is None or self._closed:
            return
        live = self._forget(external)
        tokens = self._tokens_so_far(live.internal_id)
        try:
            self._engine.abort_request([live.internal_id], internal=True)
        except Exception as exc:  # noqa: BLE001 - an abort that raises means the engine is broken
            self._fail(f"abort raised {type(exc).__name__}: {exc}")
        self._ready.append(EngineResult(request_id, tokens, "cancelled"))

    def stats(self) -> IterationStats:
        return self._sink.snapshot()

    def shutdown(self, timeout_s: float) -> None:
        """Aborts what is in flight and stops the engine core (in this process: no child to wait
        for)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._live:
                self._engine.abort_request(
                    [live.internal_id for live in self._live.values()], internal=True
                )
            self._engine.engine_core.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down a broken engine may fail too
            log.warning("vLLM engine shutdown raised %s: %s", type(exc).__name__, exc)
        self._live.clear()
        self._by_request.clear()
        self._engine = None

    # ------------------------------------------------------------------ helpers
    def _refusal(self, r: EngineRequest) -> Optional[str]:
        if r.want_hidden:
            return EMBED_REFUSAL
        why = sampling_problem(r.sampling)
        if why is not None:
            return why
        if (
            len(r.prompt_ids) > self._lim.max_input_len
            or r.max_new_tokens > self._lim.max_output_len
        ):
            return (f"prompt {len(r.prompt_ids)} / output {r.max_new_tokens} tokens exceed the "
                    "contract's "
                    f"max_input_len {self._lim.max_input_len} / max_output_len "
                    f"{self._lim.max_output_len}")
        if not r.prompt_ids or r.max_new_tokens < 1:
            return "an empty prompt or max_new_tokens < 1"
        return None

    def _params(self, r: EngineRequest):
        """(vLLM's SamplingParams, None) or (None, why the request is refused before it runs)."""
        s, g = r.sampling, r.guide
        guide, extra = None, None
        if g is not None:
            if g.choice is not None and not self._trie_choices:
                need = spelling_bound(g.choice)
                if r.max_new_tokens < need:
                    return None, (f"choice {list(g.choice)!r:.120} on card {self.plan.card_id}: "
                                  "this vLLM guides a "
                                  f"choice by its characters, which may take {need} tokens; raise "
                                  "max_tokens to "
                                  f"{need}")
                guide = self._Guide(choice=list(g.choice))
            elif g.choice is not None:
                trie = self._choice_trie(g.choice)
                why = trie if isinstance(trie, str) else budget_problem(trie, r.max_new_tokens)
                if why is not None:
                    return (
                        None,
                        f"choice {list(g.choice)!r:.120} on card {self.plan.card_id}: {why}",
                    )
                extra = choice_extra_args(trie, self._eos)
            elif g.json_schema is not None:
                guide = self._Guide(json=g.json_schema)
            elif g.regex is not None:
                guide = self._Guide(regex=g.regex)
        temperature, top_p, top_k, seed = float(s.temperature), float(s.top_p), int(s.top_k), s.seed
        if seeded.wanted(s) and self._seeds == SEEDS_REFUSED:
            return None, SEED_REFUSAL
        if seeded.wanted(s) and self._seeds == SEEDS_BY_FORGE:
            # forge's processor draws the token and leaves it alone possible: vLLM picks it
            # greedily, with no generator of its own to wind back (forge/engines/vllm/seeded.py)
            extra = {**(extra or {}), **seeded.extra_args(s)}
            temperature, top_p, top_k, seed = 0.0, 1.0, 0, None
        return self._SamplingParams(
            max_tokens=r.max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
            seed=seed, ignore_eos=not s.stop_at_eos, detokenize=False,
            output_kind=self._CUMULATIVE if r.stream else self._FINAL_ONLY,
            structured_outputs=guide, extra_args=extra), None

    def _choice_trie(self, choices) -> "ChoiceTrie | str":
        import json

        key = json.dumps(list(choices))
        trie = self._tries.get(key)
        if trie is None:
            hf = getattr(self.tokenizer, "hf", self.tokenizer)
            trie = encode_choices(
                choices, lambda c: hf.encode(c, add_special_tokens=False), self.tokenizer.decode
            )
            if len(self._tries) >= CHOICE_CACHE_ENTRIES:
                self._tries.pop(next(iter(self._tries)))
            self._tries[key] = trie
        return trie

    def _step(self, out: Progress) -> None:
        """One engine step. Requests ask for FINAL_ONLY outputs, as LLM.generate's do: vLLM then
        builds no RequestOutput for a request until it ends (DELTAs built 32 a step that forge only
        summed), and the step's token progress comes from the stats vLLM counts anyway."""
        generated = self._sink.generated
        try:
            outputs = self._engine.step()
        except Exception as exc:  # noqa: BLE001 - a step that raises leaves the engine in no known state
            self._fail(f"step raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        self._sink.steps += 1
        out.new_tokens += self._sink.generated - generated
        for o in outputs:
            live = self._live.get(o.request_id)
            if live is not None and not o.finished and live.request.stream and o.outputs:
                out.partials.append((live.request.request_id, list(o.outputs[0].token_ids)))
                continue  # a streamed request's step (CUMULATIVE: every id so far)
            if live is None or not o.finished:
                continue  # cancelled meanwhile (or not final: FINAL_ONLY sends none such)
            c = o.outputs[0] if o.outputs else None
            tokens = list(c.token_ids) if c is not None else []
            reason = FINISH_REASONS.get(str(c.finish_reason) if c is not None else "error", "error")
            self._forget(live.external_id)
            if reason == "eos" and c.stop_reason is None and tokens:
                # vLLM keeps the EOS it stopped at in the ids; output_ids carry text tokens only (as
                # the transformers engine's do), and the reason says it ended
                tokens.pop()
                out.new_tokens -= 1
            out.results.append(EngineResult(live.request.request_id, tokens, reason,
                                            error=None if reason != "error" else "vLLM ended the "
                                                                                 "request"))

    def _tokens_so_far(self, internal_id: str) -> list[int]:
        """A running request's tokens, read from vLLM's output processor (FINAL_ONLY sends none
        before the end): its per-request state keeps every sampled id. [] where that state is not
        there (not yet or no longer)."""
        state = getattr(self._engine.output_processor, "request_states", {}).get(internal_id)
        detokenizer = getattr(state, "detokenizer", None)
        return list(detokenizer.output_token_ids) if detokenizer is not None else []

    def _forget(self, external: str) -> _Live:
        live = self._live.pop(external)
        self._by_request.pop(live.request.request_id, None)
        return live

    def _fail(self, why: str) -> None:
        self._failed = why
        raise EngineFailed(f"vLLM engine: {why}")

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise EngineFailed("vLLM engine is shut down")
        if self._failed:
            raise EngineFailed(f"vLLM engine: {self._failed}")


def tokens_prompt():
    """ids -> the prompt vLLM takes: `vllm.inputs.tokens_input` where the installed vLLM has it (the
    raw TokensPrompt dict is deprecated there), else that dict."""
    import vllm.inputs

    if hasattr(vllm.inputs, "tokens_input"):
        return vllm.inputs.tokens_input
    return lambda ids: vllm.inputs.TokensPrompt(prompt_token_ids=ids)


def request_errors() -> tuple[type, ...]:
    """The exceptions with which vLLM's add_request refuses one request (its validation): ValueError
    and TypeError, and vLLM's VLLMClientError (VLLMValidationError is one), which derives from
    neither."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMClientError)
