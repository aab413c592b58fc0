"""Backend `trtllm`: TensorRT-LLM as a forge Engine (the production target).

NOT RUN ON A REAL ENGINE. TensorRT-LLM cannot be installed on the machines forge is built on, so
this module is written against the API as read in TensorRT-LLM's sources (docs/trtllm.md names the
files and versions) and has never driven a real Executor or LLM. Every setting it passes comes from
forge.engines.trtllm.mapping.engine_arguments, which is unit-tested; this module only asks the
installed release what it has (`install.installed_release`), turns those arguments into objects and
logs what was set.

  artifact.checkpoint  -> tensorrt_llm.LLM on the PyTorch backend (the primary path)
  artifact.engine_dir  -> tensorrt_llm.bindings.executor.Executor (releases up to 1.2.x ship it)

Importing this module imports nothing from TensorRT-LLM (nor torch/transformers); the factory does.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any, Hashable, Optional, Sequence

from forge.config.models import Contract
from forge.config.plan import CardPlan
from forge.engines.trtllm import mapping as tm
from forge.engines.trtllm.install import first_line, installed_release, require
from forge.engines.trtllm.release import Release
from forge.engines.trtllm.rules import BACKEND, engine_dir_matches, gpu_target_and_engine_dir
from forge.engines.trtllm.section import TrtllmSection
from forge.backends import Backend
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
from forge.errors import ConfigError, EngineUnavailable, Problem
from forge.hookspecs import hookimpl

STATS_WAIT_S = 0.01          # LLM.get_stats waits at most this long for queued stats
log = logging.getLogger("forge.engines.trtllm")


@hookimpl
def forge_register_backend(register):
    register(
        Backend(
            name=BACKEND,
            factory=create_engine,
            section=TrtllmSection,
            rules=(trtllm_contract_rule,),
            contract_rules=(gpu_target_and_engine_dir,),
            artifact_checks=(engine_dir_matches,),
            engine_arguments=planned_engine_arguments,
            label="TensorRT-LLM",
        )
    )


def planned_engine_arguments(contract: Contract, plan: CardPlan) -> dict:
    """What `forge provision --dry-run` shows: the arguments checked against the installed release
    where TensorRT-LLM is importable, else against none (Release.unchecked: every field the contract
    needs is shown)."""
    try:
        release = installed_release()
    except Exception:   # noqa: BLE001 - not installed here (the usual case off a GPU machine): plan unchecked
        release = Release.unchecked()
    return tm.engine_arguments(contract, plan, release)


def trtllm_contract_rule(loaded) -> list[Problem]:
    """`forge validate`: what TensorRT-LLM would refuse in a trtllm contract, before any GPU is
    touched."""
    return [
        p for c in loaded.contracts.values() if c.backend == "trtllm" for p in tm.trtllm_refusals(c)
    ]


def create_engine(contract: Contract, plan: CardPlan, *,
                  capacity_scheduler_policy: str = tm.DEFAULT_CAPACITY_POLICY) -> Engine:
    """Build the engine for one card with exactly the contract's settings (blocks while it
    loads)."""
    problems = tm.contract_problems(contract)
    if problems:
        raise ConfigError(problems)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")   # CUDA ordinals follow NVML's order
    try:
        ordinal = tm.cuda_device_ordinal(plan.card.index, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except ValueError as e:
        raise EngineUnavailable(f"backend 'trtllm': {e}") from None
    require("tensorrt_llm")      # fails here, in one line, where TensorRT-LLM is missing or broken
    release = installed_release()
    args = tm.engine_arguments(
        contract,
        plan,
        release,
        capacity_scheduler_policy=capacity_scheduler_policy,
        device_ordinal=ordinal,
    )
    if contract.artifact.checkpoint is not None and ordinal != 0:
        raise EngineUnavailable("backend 'trtllm' runs a checkpoint on the first visible GPU: "
                                "start card "
                                f"{plan.card.index}'s engine with "
                                f"CUDA_VISIBLE_DEVICES={plan.card.index}")
    log.info(
        "trtllm card %d: TensorRT-LLM %s, %s with %s; not passed: %s",
        plan.card.index,
        release.version,
        args["api"],
        json.dumps(args["kwargs"], sort_keys=True),
        json.dumps(args["not_passed"], sort_keys=True),
    )
    tokenizer = _load_tokenizer(contract)
    if contract.artifact.engine_dir is not None:
        return ExecutorEngine(contract, tokenizer, args)
    return LlmApiEngine(contract, tokenizer, args, release)


def _load_tokenizer(contract: Contract) -> Any:
    rel = contract.artifact.tokenizer or contract.artifact.checkpoint
    field = "$.artifact.tokenizer" if contract.artifact.tokenizer else "$.artifact.checkpoint"
    where = tm.contract_where(contract)
    transformers = require("transformers")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(contract.resolve(rel)))
    except Exception as e:
        raise ConfigError(
            [Problem(where, field, f"cannot load a tokenizer from {rel}: {e}")]
        ) from None
    if tok.eos_token_id is None:
        raise ConfigError([Problem(where, field, f"the tokenizer in {rel} has no eos token")])
    return tok


class _TrtllmEngine(Engine):
    """What both paths share: refusals, the in-flight cap, refused results, describe()."""

    name = "trtllm"
    supports_hidden = False

    def __init__(
        self, contract: Contract, tokenizer: Any, settings: dict[str, Any], seed_honoured: bool
    ):
        self.tokenizer = tokenizer
        self._contract = contract
        self._settings = settings
        self._seed_honoured = seed_honoured
        self._eos = int(tokenizer.eos_token_id)
        self._pad = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self._lock = threading.Lock()
        self._refused: list[EngineResult] = []
        self._last_stats = IterationStats()
        self._closed = False

    def _inflight(self) -> int:
        raise NotImplementedError

    def _admit(self, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        """Refuse the batch (EngineBusy) past the slots; fail single requests the engine cannot
        honour."""
        if self._closed:
            raise EngineFailed("the trtllm engine was shut down")
        if self._inflight() + len(requests) > self._contract.limits.max_batch_size:
            raise EngineBusy(f"{self._inflight()} in flight of "
                             f"{self._contract.limits.max_batch_size} slots")
        accepted = []
        for r in requests:
            why = tm.request_refusal(
                self._contract, r, self.supports_guides, seed_honoured=self._seed_honoured
            )
            if why:
                with self._lock:
                    self._refused.append(EngineResult(r.request_id, [], REFUSED, error=why))
            else:
                accepted.append(r)
        return accepted

    def _take_refused(self) -> list[EngineResult]:
        with self._lock:
            out, self._refused = self._refused, []
        return out

    def _remember(self, latest: Optional[IterationStats]) -> IterationStats:
        if latest is not None:
            self._last_stats = latest
        elif self._inflight() == 0:   # no step ran since the last call and nothing waits: idle
            self._last_stats = tm.idle_stats(self._last_stats)
        return self._last_stats

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "trtllm",
            "contract": self._contract.contract,
            "settings": self._settings,
        }


def _join(target, timeout_s: float, what: str) -> None:
    """Run a blocking TensorRT-LLM call on a helper thread and wait at most timeout_s for it."""
    t = threading.Thread(target=target, name=f"trtllm-{what}", daemon=True)
    t.start()
    t.join(max(timeout_s, 0.0))
    if t.is_alive():
        raise EngineFailed(f"TensorRT-LLM {what} did not finish within {timeout_s:.0f}s")


class ExecutorEngine(_TrtllmEngine):
    """An engine directory driven through the Executor API (streaming responses, bounded awaits)."""

    def __init__(self, contract: Contract, tokenizer: Any, args: dict[str, Any]):
        tle = require("tensorrt_llm.bindings.executor")
        spec = args["kwargs"]
        # the C++ runtime takes SamplingConfig.seed per request: a request's seed is honoured on
        # this path
        super().__init__(contract, tokenizer, args, seed_honoured=True)
        self._tle = tle
        guided = None
        if hasattr(tokenizer, "backend_tokenizer"):  # XGrammar needs a fast tokenizer's JSON
            g = tm.guided_decoding_config_spec(
                tokenizer.get_vocab(), tokenizer.backend_tokenizer.to_str(), self._eos
            )
            guided = tle.GuidedDecodingConfig(
                backend=getattr(tle.GuidedDecodingConfig.GuidedDecodingBackend, g.pop("backend")),
                **g,
            )
            self.supports_guides = frozenset({"choice", "json_schema", "regex"})
        plain = {k: v for k, v in spec.items() if not k.endswith("_config")}
        plain["batching_type"] = getattr(tle.BatchingType, plain["batching_type"])
        par = spec["parallel_config"]
        config = tle.ExecutorConfig(
            **plain,
            scheduler_config=tle.SchedulerConfig(
                capacity_scheduler_policy=getattr(
                    tle.CapacitySchedulerPolicy,
                    spec["scheduler_config"]["capacity_scheduler_policy"],
                )
            ),
            kv_cache_config=tle.KvCacheConfig(**spec["kv_cache_config"]),
            parallel_config=tle.ParallelConfig(
                communication_type=getattr(tle.CommunicationType, par["communication_type"]),
                communication_mode=getattr(tle.CommunicationMode, par["communication_mode"]),
                device_ids=par["device_ids"],
            ),
            guided_decoding_config=guided,
        )
        engine_dir = Path(contract.resolve(contract.artifact.engine_dir))
        try:
            self._executor = tle.Executor(engine_dir, tle.ModelType.DECODER_ONLY, config)
        # e.g. an engine built by another TensorRT(-LLM) version or for another GPU
        except Exception as e:
            raise EngineUnavailable(
                f"TensorRT-LLM could not load {engine_dir}: {first_line(e)}"
            ) from None
        self._ids: dict[int, str] = {}          # executor id -> forge request id
        self._by_request: dict[str, int] = {}
        self._tokens: dict[int, list[int]] = {}

    def _inflight(self) -> int:
        with self._lock:
            return len(self._ids)

    def _request(self, r: EngineRequest) -> Any:
        tle = self._tle
        s = tm.executor_request_spec(
            r.prompt_ids, r.max_new_tokens, r.sampling, r.guide, self._eos, self._pad
        )
        g = s.pop("guided_decoding_params")
        return tle.Request(
            s.pop("input_token_ids"), s.pop("max_tokens"),
            sampling_config=tle.SamplingConfig(1, **s.pop("sampling_config")),
            output_config=tle.OutputConfig(**s.pop("output_config")),
            guided_decoding_params=None if g is None else tle.GuidedDecodingParams(
                getattr(tle.GuidedDecodingParams.GuideType, g["guide_type"]), g["guide"]),
            **s)

    def submit(self, requests: Sequence[EngineRequest]) -> None:
        for r in self._admit(requests):
            try:
                eid = self._executor.enqueue_request(self._request(r))
            except Exception as e:  # an invalid request is that request's error, not the engine's
                with self._lock:
                    self._refused.append(
                        EngineResult(r.request_id, [], REFUSED, error=f"TensorRT-LLM: {e}")
                    )
                continue
            with self._lock:
                self._ids[eid], self._by_request[r.request_id], self._tokens[eid] = (
                    r.request_id,
                    eid,
                    [],
                )

    def poll(self, timeout_s: float) -> Progress:
        progress = Progress(results=self._take_refused())
        wait = 0.0 if progress.results else max(timeout_s, 0.0)
        try:
            responses = self._executor.await_responses(timeout=datetime.timedelta(seconds=wait))
        except Exception as e:
            raise EngineFailed(f"TensorRT-LLM executor failed: {e}") from None
        for resp in responses:
            with self._lock:
                rid = self._ids.get(resp.request_id)
            if rid is None:
                continue
            if resp.has_error():
                self._finish(resp.request_id, progress, "error", resp.error_msg)
                continue
            result = resp.result
            new = list(result.output_token_ids[0]) if result.output_token_ids else []
            self._tokens[resp.request_id].extend(new)
            progress.new_tokens += len(new)
            if result.is_final:
                name = result.finish_reasons[0].name if result.finish_reasons else "NOT_FINISHED"
                self._finish(resp.request_id, progress, *tm.finish_reason_from_executor(name))
        return progress

    def _finish(self, eid: int, progress: Progress, reason: str, error: Optional[str]) -> None:
        with self._lock:
            rid = self._ids.pop(eid)
            self._by_request.pop(rid, None)
            tokens = self._tokens.pop(eid, [])
        progress.results.append(EngineResult(rid, tokens, reason, error=error))

    def cancel(self, request_id: Hashable) -> None:
        with self._lock:
            eid = self._by_request.get(request_id)
        if eid is not None:
            self._executor.cancel_request(eid)   # the final response arrives with CANCELLED

    def stats(self) -> IterationStats:
        items = self._executor.get_latest_iteration_stats()
        return self._remember(tm.latest_iteration_stats([s.to_json_str() for s in items]))

    def shutdown(self, timeout_s: float) -> None:
        self._closed = True
        with self._lock:
            ids = list(self._ids)
        for eid in ids:
            self._executor.cancel_request(eid)
        _join(self._executor.shutdown, timeout_s, "shutdown")


class LlmApiEngine(_TrtllmEngine):
    """A checkpoint on the LLM API's PyTorch backend; requests stream on a private asyncio loop."""

    def __init__(self, contract: Contract, tokenizer: Any, args: dict[str, Any], release: Release):
        llmapi = require("tensorrt_llm.llmapi")
        super().__init__(contract, tokenizer, args, seed_honoured=release.per_request_seed)
        self.supports_guides = frozenset({"choice", "json_schema", "regex"})
        self._SamplingParams, self._Guided = llmapi.SamplingParams, llmapi.GuidedDecodingParams
        spec = dict(args["kwargs"])
        scheduler = dict(spec.pop("scheduler_config"))
        scheduler["capacity_scheduler_policy"] = getattr(llmapi.CapacitySchedulerPolicy,
                                                         scheduler["capacity_scheduler_policy"])
        graphs_cls = (
            getattr(llmapi, "CudaGraphConfig", None)
            or require("tensorrt_llm.llmapi.llm_args").CudaGraphConfig
        )
        try:
            self._llm = llmapi.LLM(**{k: v for k, v in spec.items() if not k.endswith("_config")},
                                   kv_cache_config=llmapi.KvCacheConfig(**spec["kv_cache_config"]),
                                   scheduler_config=llmapi.SchedulerConfig(**scheduler),
                                   cuda_graph_config=graphs_cls(**spec["cuda_graph_config"]))
        except Exception as e:
            raise EngineUnavailable(
                f"TensorRT-LLM could not load {spec['model']}: {first_line(e)}"
            ) from None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="trtllm-llmapi", daemon=True
        )
        self._thread.start()
        self._done: queue.Queue[EngineResult] = queue.Queue()   # bounded by the in-flight cap
        # forge request id -> GenerationResult (None until started)
        self._running: dict[str, Any] = {}
        self._cancelled: set[str] = set()       # cancelled before its GenerationResult existed
        self._new_tokens = 0

    def _inflight(self) -> int:
        with self._lock:
            return len(self._running)

    def submit(self, requests: Sequence[EngineRequest]) -> None:
        for r in self._admit(requests):
            s = tm.sampling_params_spec(r.max_new_tokens, r.sampling, r.guide, self._eos, self._pad)
            g = s.pop("guided_decoding", None)
            params = self._SamplingParams(
                **s, guided_decoding=None if g is None else self._Guided(**g)
            )
            with self._lock:
                self._running[r.request_id] = None
            asyncio.run_coroutine_threadsafe(self._drive(r, params), self._loop)

    async def _drive(self, r: EngineRequest, params: Any) -> None:
        seen, out = 0, None
        try:
            # called on the loop so the result gets an asyncio queue; streaming gives a response per
            # step
            gen = self._llm.generate_async(
                list(r.prompt_ids), sampling_params=params, streaming=True
            )
            with self._lock:
                self._running[r.request_id] = gen
                early = r.request_id in self._cancelled
            if early:
                gen.abort()
            async for out in gen:
                n = len(out.outputs[0].token_ids)
                with self._lock:
                    self._new_tokens += n - seen
                seen = n
            c = out.outputs[0]
            reason, error = tm.finish_reason_from_llmapi(c.finish_reason)
            result = EngineResult(r.request_id, list(c.token_ids), reason, error=error)
        except Exception as e:
            result = EngineResult(r.request_id, [], "error", error="TensorRT-LLM failed the "
                                                                   f"request: {e}")
        with self._lock:
            self._running.pop(r.request_id, None)
            self._cancelled.discard(r.request_id)
        self._done.put(result)

    def poll(self, timeout_s: float) -> Progress:
        if not self._thread.is_alive():
            raise EngineFailed("the trtllm request loop stopped")
        progress = Progress(results=self._take_refused())
        try:
            progress.results.append(
                self._done.get(timeout=0.0 if progress.results else max(timeout_s, 0.0))
            )
            while True:
                progress.results.append(self._done.get_nowait())
        except queue.Empty:
            pass
        with self._lock:
            progress.new_tokens, self._new_tokens = self._new_tokens, 0
        return progress

    def cancel(self, request_id: Hashable) -> None:
        with self._lock:
            if request_id not in self._running:
                return
            gen = self._running[request_id]
            if gen is None:
                self._cancelled.add(request_id)
        if gen is not None:
            self._loop.call_soon_threadsafe(gen.abort)   # finishes with finish_reason 'cancelled'

    def stats(self) -> IterationStats:
        return self._remember(tm.latest_iteration_stats(self._llm.get_stats(timeout=STATS_WAIT_S)))

    def shutdown(self, timeout_s: float) -> None:
        self._closed = True
        with self._lock:
            gens = [g for g in self._running.values() if g is not None]
        for g in gens:
            self._loop.call_soon_threadsafe(g.abort)
        try:
            _join(self._llm.shutdown, timeout_s, "shutdown")
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
