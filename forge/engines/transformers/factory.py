"""Build a TransformersEngine from a contract and its card plan: load, size the continuous-batching
manager from the contract (never from transformers' defaults), check it holds what the plan says,
start its loop."""
from __future__ import annotations

import logging
import time

from forge.config.plan import CardPlan, one_engine
from forge.engines.transformers import requests as reqs
from forge.engines.transformers.sizing import (
    cb_config_kwargs,
    device_of,
    dtype_of,
    section_of,
    where,
)
from forge.engines.interface import Sampling
from forge.errors import EngineUnavailable, ForgeError

log = logging.getLogger("forge.engines.transformers")


# Why each fast path cannot run a guide, as read in transformers 5.24's continuous batching
# (docs/serve.md, "Guided output and the fast tiers", has the file/function walk-through). The guide
# processor (guided.py) builds each guided row's mask in Python every step: prepare_tensor_args
# computes it from the request's tokens so far, and __call__ applies it (and, for JSON near the end
# of the budget, reads that row's scores on the host).
GUIDE_BLOCKERS = (
    ("use_cuda_graph", "transformers.use_cuda_graph",
     "the CUDA graph captures the logits processors together with the forward "
     "(model_runner.py ModelRunner._forward_process_and_sample, captured once by _capture_graph), "
     "so a replay "
     "repeats the masks of the warm-up, where no request was guided: guides would be silently "
     "ignored"),
    ("compile_level", "transformers.compile_level > 0",
     "torch.compile wraps that same step (ModelRunner.__init__: _compiled_varlen, "
     "_compiled_decode), tracing the "
     "guide's per-step Python into it: correct only through dynamo's guards, at a recompile every "
     "step"),
    ("async_batching", "transformers.async_batching",
     "batch N+1 (its processors' arguments included) is prepared while batch N still runs and N's "
     "token reaches "
     "N+1 only on the device (continuous_api.py _generation_loop_body, input_outputs.py "
     "carry_over_tokens): every "
     "mask would be one token behind"),
)


def guides_unavailable(section) -> str:
    """Why guided output is off for these settings ('' when it is on): one reason per fast path the
    contract sets."""
    off = [f"{name} ({why})" for attr, name, why in GUIDE_BLOCKERS
           if (getattr(section, attr) > 0 if attr == "compile_level" else getattr(section, attr))]
    return f"guided output needs the eager loop; this contract sets {'; '.join(off)}" if off else ""


def _guard_request_kwargs(manager) -> None:
    """Defence in depth: the loop checks each new request's processor values (types only) inside its
    own try, so a request failing there fails alone. Add forge's range checks to it: should a value
    the engine's submit checks missed ever reach the loop (top_k 2**31, a zero temperature to divide
    by), that request ends with an error instead of the step that would have run it ending the loop
    for every request on the card."""
    lp = manager.logit_processor
    types_only = lp.check_kwargs

    def check_kwargs(kwargs: dict) -> None:
        types_only(kwargs)
        why = reqs.loop_kwargs_problem(kwargs or {})
        if why is not None:
            raise ValueError(f"refused: {why} is outside what the sampler can represent")

    lp.check_kwargs = check_kwargs


def build_engine(contract, plan: CardPlan):
    try:
        import torch
        from transformers import ContinuousBatchingConfig, GenerationConfig
    except ImportError as exc:
        raise EngineUnavailable("the transformers backend needs the engine extra (torch, "
                                f"transformers): {exc}") from None
    from forge.engines.transformers.engine import TransformersEngine
    from forge.engines.transformers.loading import load_model, load_tokenizer

    if contract is not plan.contract and contract != plan.contract:
        raise ForgeError(f"{where(plan)}: the card plan was made for contract "
                         f"{plan.contract.contract}, "
                         f"not {contract.contract}")
    if one_engine(plan):
        raise ForgeError(one_engine(plan))
    section = section_of(plan)
    device = device_of(plan)
    if device.startswith("cuda") and (
        not torch.cuda.is_available() or plan.card.index >= torch.cuda.device_count()
    ):
        raise EngineUnavailable(
            f"{plan.card_id}: no CUDA device {plan.card.index} visible to torch"
        )
    dtype = dtype_of(plan, section)
    tokenizer = load_tokenizer(plan)
    model, weights = load_model(
        plan,
        device=device,
        dtype=dtype,
        attn_implementation=section.attn_implementation,
        seed=section.seed,
    )

    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = (
            model.config.eos_token_id
            if model.config.eos_token_id is not None
            else tokenizer.eos_token_id
        )
    vocab = plan.contract.model.vocab_size
    gen_kwargs = reqs.generation_config_kwargs(
        sampling_mode=section.sampling,
        vocab_size=vocab,
        eos_token_id=eos if eos is not None else -1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        max_output_len=plan.contract.limits.max_output_len,
    )
    cb_kwargs = cb_config_kwargs(plan, section)
    no_guides_why = guides_unavailable(section)
    try:
        manager = model.init_continuous_batching(
            generation_config=GenerationConfig(**gen_kwargs),
            continuous_batching_config=ContinuousBatchingConfig(**cb_kwargs),
        )
        _guard_request_kwargs(manager)
        guides = None
        # the guide processor must be in place before warmup builds the loop's buffers
        if not no_guides_why:
            from forge.engines.transformers.guided import install

            eos_ids = eos if isinstance(eos, (list, tuple)) else [eos]
            guides = install(
                manager,
                tokenizer,
                vocab,
                [int(e) for e in eos_ids if e is not None and int(e) >= 0],
            )
        seeds = None
        # per-request seeds: the same eager loop
        if not no_guides_why and section.sampling == "per_request":
            from forge.engines.transformers.seeded import install as install_seeds

            seeds = install_seeds(manager)
        # Builds the paged cache and the scheduler now, in this thread, so a sizing error is raised
        # here and not inside the loop thread (on CPU nothing is captured or compiled).
        manager.warmup()
    except (MemoryError, ValueError, RuntimeError, TypeError) as exc:
        raise ForgeError(f"{where(plan)}: transformers refused the engine settings "
                         f"({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]})") from None
    from forge.engines.transformers import graph_shapes

    shapes_report = None
    if graph_shapes.in_use(section):  # captured before the loop starts, in the thread that built it
        shapes_report = graph_shapes.capture_at_load(plan, section, manager.batch_processor, model)

    cache, resolved = manager.batch_processor.cache, manager.continuous_batching_config
    if (
        cache.num_blocks < plan.num_blocks
        or cache.max_batch_tokens != plan.contract.limits.max_num_tokens
    ):
        raise ForgeError(f"{where(plan)}: transformers built {cache.num_blocks} KV blocks and a "
                         f"{cache.max_batch_tokens}-token step; the plan says {plan.num_blocks} "
                         "blocks and "
                         f"{plan.contract.limits.max_num_tokens} tokens")
    info = {
        "backend": "transformers",
        "card": plan.card_id,
        "device": device,
        "dtype": dtype,
        "attn_implementation": section.attn_implementation,
        "weights": weights,
        "sampling": section.sampling,
        "eos_token_id": eos,
        "continuous_batching_config": cb_kwargs,
        "resolved": {  # what transformers made of it, read back after the cache was built
            "num_blocks": int(cache.num_blocks),
            "max_batch_tokens": int(cache.max_batch_tokens),
            "page_size": resolved.page_size,
            "max_requests_per_batch": resolved.max_requests_per_batch,
            "max_blocks_per_request": resolved.max_blocks_per_request,
            "use_cuda_graph": list(resolved.cuda_graph_booleans),
            "use_async_batching": resolved.use_async_batching,
            "max_memory_percent": resolved.max_memory_percent,
            "prefix_sharing": bool(cache.use_prefix_sharing),
            # graph shapes: query and KV read
            "q_padding_interval_size": resolved.q_padding_interval_size,
            # padded to these (graphs, compile)
            "kv_padding_interval_size": resolved.kv_padding_interval_size,
        },
        "generation_config": gen_kwargs,
    }
    if shapes_report is not None:
        info["graph_shapes"] = shapes_report
    engine = TransformersEngine(
        plan,
        section,
        model,
        tokenizer,
        manager,
        device=device,
        eos=eos,
        info=info,
        guides=guides,
        no_guides_why=no_guides_why,
        seeds=seeds,
    )
    manager.start()
    # a fresh process's first full-size steps, before any job's (warm.py)
    if device.startswith("cuda"):
        from forge.engines.transformers.warm import warm_up

        t0 = time.monotonic()
        try:
            why = warm_up(
                manager,
                budget=plan.contract.limits.max_num_tokens,
                max_input_len=plan.contract.limits.max_input_len,
                slots=plan.contract.limits.max_batch_size,
                vocab_size=vocab,
                request_kwargs=reqs.processor_kwargs(
                    Sampling(), sampling_mode=section.sampling, vocab_size=vocab
                ),
            )
        except Exception as exc:  # noqa: BLE001 - a warm-up never stops a card; its loop's health is checked on use
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            log.warning(
                "%s: engine warm-up cut short (%s); the engine is used as it is", plan.card_id, why
            )
        engine._info["warm_up_s"] = round(time.monotonic() - t0, 2)
    return engine
