"""The "direct" mode: transformers' continuous batching driven through its own API, with none of
forge's layers (no broker, admission, ledger or functions) but exactly the engine forge would build
from the same contract: the same model build and seed, the same ContinuousBatchingConfig (forge's
pure mapping), the same generation config and EOS, and the tier's cached CUDA-graph shapes captured
at load (transformers.graph_shape_cache). Only the manager's input queue is unbounded, so
"everything at once" can be.

The engine's own ways of being fed, each a variant; the bench reports the best of those it ran,
because feeding the in-flight batcher at a controlled depth was measured to beat handing it
everything (shared/reference/transformers-engine.md):

    all      every request handed in at once, in arrival order
    sorted   every request at once, in the order transformers' own batch API (generate_batch ->
             add_requests) uses when prefix sharing is on: prompts sorted, so shared prefixes are adjacent
    depth:N  N requests in flight, the next one added as each finishes (arrival order)
    longest:N  the same, longest requested output first (the order forge's grouped broker keeps within a
             prefix group and length bucket; over the whole workload here)

Each variant gets a fresh manager (an empty KV cache: nothing cached by one variant helps the
next)."""
from __future__ import annotations

import gc
import time
from typing import Optional, Sequence

from forge.config.plan import CardPlan
from forge.engines.interface import Sampling
from forge.errors import ForgeError, UsageError
from forge.gc_tuning import tune_for_throughput
from forge_bench.gpu_sampler import GpuSampler, gpus_of
from forge_bench.results import ModeResult
from forge_bench.workload import BenchRequest

RESULT_WAIT_S = 0.5               # one bounded wait on the manager's output queue
STALL_LIMIT_S = 120.0             # no result for this long with work outstanding: the run is failed


def parse_variants(text: str, slots: int) -> list[str]:
    """"all,sorted,depth:64" -> checked variant names; "depth" alone means depth = the contract's
    slots."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part in ("all", "sorted"):
            out.append(part)
        elif part in ("depth", "longest"):
            out.append(f"{part}:{slots}")
        elif part.startswith(("depth:", "longest:")) and part.split(":", 1)[1].isdigit() \
                and int(part.split(":", 1)[1]) > 0:
            out.append(part)
        else:
            raise UsageError(f"--direct: unknown variant {part!r} (all | sorted | depth | depth:N "
                             "| longest | "
                             "longest:N)")
    if not out:
        raise UsageError("--direct: name at least one variant")
    return out


class DirectEngine:
    """The model and the manager settings of one transformers-backend card, built as forge's factory
    does."""

    def __init__(self, plan: CardPlan):
        if plan.contract.backend != "transformers":
            raise ForgeError("the direct mode drives transformers' continuous batching; card "
                             f"{plan.card_id} runs "
                             f"backend {plan.contract.backend!r}")
        from forge.engines.transformers import requests as reqs
        from forge.engines.transformers.loading import load_model, load_tokenizer
        from forge.engines.transformers.sizing import (
            cb_config_kwargs,
            device_of,
            dtype_of,
            section_of,
        )

        self.plan = plan
        self.section = section = section_of(plan)
        self.device = device_of(plan)
        tokenizer = load_tokenizer(plan)
        self.model, _ = load_model(
            plan,
            device=self.device,
            dtype=dtype_of(plan, section),
            attn_implementation=section.attn_implementation,
            seed=section.seed,
        )
        gc_ = self.model.generation_config
        eos = gc_.eos_token_id if gc_ is not None else None
        if eos is None:
            eos = (
                self.model.config.eos_token_id
                if self.model.config.eos_token_id is not None
                else tokenizer.eos_token_id
            )
        eos_ids = [
            e
            for e in (eos if isinstance(eos, (list, tuple)) else [eos])
            if e is not None and int(e) >= 0
        ]
        self.eos_set = {int(e) for e in eos_ids}
        self.eos_arg = (
            sorted(self.eos_set) if len(self.eos_set) > 1 else next(iter(self.eos_set), -1)
        )
        self.gen_kwargs = reqs.generation_config_kwargs(
            sampling_mode=section.sampling, vocab_size=plan.contract.model.vocab_size,
            eos_token_id=eos if eos is not None else -1, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, max_output_len=plan.contract.limits.max_output_len)
        # Greedy requests in per_request mode pass these, exactly as forge's engine does.
        self.request_kwargs = reqs.processor_kwargs(Sampling(), sampling_mode=section.sampling,
                                                    vocab_size=plan.contract.model.vocab_size)
        self.cb_kwargs = dict(cb_config_kwargs(plan, section), max_queue_size=0)
        # The same collector settings as forge's node and card workers (forge/gc_tuning.py), so that
        # every direct repeat runs alike: the bench's process is tuned anyway once its first forge
        # run has started a node.
        tune_for_throughput()

    def manager(self):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        m = self.model.init_continuous_batching(
            generation_config=GenerationConfig(**self.gen_kwargs),
            continuous_batching_config=ContinuousBatchingConfig(**self.cb_kwargs),
        )
        m.warmup()
        from forge.engines.transformers import graph_shapes

        # the tier's cached graph shapes, as forge's engine does
        if graph_shapes.in_use(self.section):
            graph_shapes.capture_at_load(self.plan, self.section, m.batch_processor, self.model)
        return m

    def close(self) -> None:
        self.model = None
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def run(
        self,
        requests: Sequence[BenchRequest],
        variant: str,
        *,
        warmup: Sequence[BenchRequest] = (),
        warm_jobs: Sequence[Sequence[BenchRequest]] = (),
    ) -> ModeResult:
        """One window of `requests` fed as `variant` says, on a new manager. Before it, outside the
        window: the warm-up requests, then each warm job (whole jobs of other records, fed the same
        way) through the same manager, as a forge node runs its warm jobs (`--warm-jobs`): its CUDA
        graphs and allocator are then those of a manager that has run work of this shape."""
        m = self.manager()
        hits = _count_prefix_hits(m.batch_processor.cache)
        m.start()
        try:
            if warmup:
                _feed(m, list(warmup), None, self, "warm")
            for k, job in enumerate(warm_jobs):
                order, depth = _order(job, variant, self.cb_kwargs["allow_block_sharing"])
                _feed(m, order, depth, self, f"wj{k}-")
            hits[0] = 0
            order, depth = _order(requests, variant, self.cb_kwargs["allow_block_sharing"])
            sampler = GpuSampler(gpus_of([self.plan])).start()
            steps0 = int(getattr(m, "current_batch", 0) or 0)
            try:
                res = _feed(m, order, depth, self, "r")
            finally:
                gpu_util = sampler.stop()
            res.engine_steps = int(getattr(m, "current_batch", 0) or 0) - steps0 or None
            res.variant, res.prefix_hit_tokens = variant, hits[0]
            res.gpu_util, res.gpu_util_missing = gpu_util, sampler.missing
            if warm_jobs:
                res.notes.append(f"after {len(warm_jobs)} warm job(s) on the same manager "
                                 f"({sum(len(j) for j in warm_jobs)} records; own prompts)")
            return res
        finally:
            processor = m.batch_processor
            m.stop(block=True, timeout=30, hard_stop=True)
            from forge.engines.transformers import graph_shapes

            # as forge's engine does
            if processor is not None and graph_shapes.in_use(self.section):
                graph_shapes.record(self.plan, self.section, processor)
            m.destroy()
            gc.collect()


def _order(
    requests: Sequence[BenchRequest], variant: str, block_sharing: bool
) -> tuple[list[BenchRequest], Optional[int]]:
    """The order a variant hands requests in, and how many it keeps in flight (None: all at
    once)."""
    order = list(requests)
    depth: Optional[int] = None
    if variant == "sorted" and block_sharing:
        order.sort(key=lambda r: r.prompt, reverse=True)      # what add_requests does
    elif variant.startswith("depth:"):
        depth = int(variant[6:])
    elif variant.startswith("longest:"):
        depth = int(variant[8:])
        order.sort(key=lambda r: -r.max_new_tokens)           # stable: arrival order among equals
    return order, depth


def _count_prefix_hits(cache) -> list[int]:
    """Prompt tokens served from shared blocks, counted by wrapping the cache's lookup (as forge's
    engine does)."""
    box = [0]
    lookup = cache.search_prefix_match

    def counted(request_id, prompt_ids):
        n = lookup(request_id, prompt_ids)
        box[0] += n
        return n

    cache.search_prefix_match = counted
    return box


def _feed(
    m, order: list[BenchRequest], depth: Optional[int], eng: DirectEngine, tag: str
) -> ModeResult:
    """Hand requests in (all at once, or `depth` in flight), collect every result, time the
    window."""
    res = ModeResult(
        mode="direct", variant=("all" if depth is None else f"depth:{depth}"), requests=len(order)
    )
    by_id = {f"{tag}{r.index}": r for r in order}
    nxt = 0

    def add(r: BenchRequest) -> None:
        got = m.add_request(
            list(r.prompt),
            request_id=f"{tag}{r.index}",
            max_new_tokens=r.max_new_tokens,
            eos_token_id=eng.eos_arg,
            **eng.request_kwargs,
        )
        if got is None:
            raise ForgeError("transformers' manager refused a request (its loop is not running)")

    t0 = time.perf_counter()
    res.started_at = time.time()
    limit = len(order) if depth is None else min(depth, len(order))
    while nxt < limit:
        add(order[nxt])
        nxt += 1
    outstanding, last = len(order), time.perf_counter()
    while outstanding:
        out = m.get_result(timeout=RESULT_WAIT_S)
        now = time.perf_counter()
        if out is None:
            if not m.is_running() or now - last > STALL_LIMIT_S:
                res.notes.append(f"{outstanding} request(s) never finished "
                                 f"({'loop stopped' if not m.is_running() else 'stalled'})")
                break
            continue
        if not out.is_finished() or out.request_id not in by_id:
            continue
        last = now
        outstanding -= 1
        req = by_id.pop(out.request_id)
        if out.error is not None:
            res.failed += 1
        else:
            toks = out.generated_tokens
            n = len(toks) - (1 if toks and toks[-1] in eng.eos_set else 0)
            res.completed += 1
            res.input_tokens += len(req.prompt)
            res.output_tokens += n
        if depth is not None and nxt < len(order):
            add(order[nxt])
            nxt += 1
    res.window_s = time.perf_counter() - t0
    return res


def direct_engine(plan):
    """The direct mode's engine for this card's backend: its own API, the arguments forge's mapping
    gives."""
    if plan.contract.backend == "vllm":
        from forge_bench.direct_vllm import VllmDirectEngine

        return VllmDirectEngine(plan)
    return DirectEngine(plan)
