"""Build a TransformersEngine from a contract and its card plan: load, size the continuous-batching manager from
the contract (never from transformers' defaults), check it holds what the plan says, start its loop."""
from __future__ import annotations

from forge.config.plan import CardPlan, one_engine
from forge.engines.hf import requests as reqs
from forge.engines.hf.sizing import cb_config_kwargs, device_of, dtype_of, section_of, where
from forge.errors import EngineUnavailable, ForgeError


def guides_unavailable(section) -> str:
    """Why guided output is off for these settings ('' when it is on): the guide processor runs Python each step,
    which a captured CUDA graph, a compiled step or a step prepared ahead (async batching) would not re-run."""
    off = [name for name, on in (("transformers.use_cuda_graph", section.use_cuda_graph),
                                 ("transformers.compile_level > 0", section.compile_level > 0),
                                 ("transformers.async_batching", section.async_batching)) if on]
    return f"guided output needs the eager loop; this contract sets {', '.join(off)}" if off else ""


def build_engine(contract, plan: CardPlan):
    try:
        import torch
        from transformers import ContinuousBatchingConfig, GenerationConfig
    except ImportError as exc:
        raise EngineUnavailable(f"the transformers backend needs the engine extra (torch, transformers): {exc}") from None
    from forge.engines.hf.engine import TransformersEngine
    from forge.engines.hf.loading import load_model, load_tokenizer

    if contract is not plan.contract and contract != plan.contract:
        raise ForgeError(f"{where(plan)}: the card plan was made for contract {plan.contract.contract}, "
                         f"not {contract.contract}")
    if one_engine(plan):
        raise ForgeError(one_engine(plan))
    section = section_of(plan)
    device = device_of(plan)
    if device.startswith("cuda") and (not torch.cuda.is_available() or plan.card.index >= torch.cuda.device_count()):
        raise EngineUnavailable(f"{plan.card_id}: no CUDA device {plan.card.index} visible to torch")
    dtype = dtype_of(plan, section)
    tokenizer = load_tokenizer(plan)
    model, weights = load_model(plan, device=device, dtype=dtype, attn_implementation=section.attn_implementation,
                                seed=section.seed)

    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = model.config.eos_token_id if model.config.eos_token_id is not None else tokenizer.eos_token_id
    vocab = plan.contract.model.vocab_size
    gen_kwargs = reqs.generation_config_kwargs(
        sampling_mode=section.sampling, vocab_size=vocab, eos_token_id=eos if eos is not None else -1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        max_output_len=plan.contract.limits.max_output_len)
    cb_kwargs = cb_config_kwargs(plan, section)
    no_guides_why = guides_unavailable(section)
    try:
        manager = model.init_continuous_batching(generation_config=GenerationConfig(**gen_kwargs),
                                                 continuous_batching_config=ContinuousBatchingConfig(**cb_kwargs))
        guides = None
        if not no_guides_why:   # the guide processor must be in place before warmup builds the loop's buffers
            from forge.engines.hf.guided import install

            eos_ids = eos if isinstance(eos, (list, tuple)) else [eos]
            guides = install(manager, tokenizer, vocab, [int(e) for e in eos_ids if e is not None and int(e) >= 0])
        # Builds the paged cache and the scheduler now, in this thread, so a sizing error is raised here and not
        # inside the loop thread (on CPU nothing is captured or compiled).
        manager.warmup()
    except (MemoryError, ValueError, RuntimeError, TypeError) as exc:
        raise ForgeError(f"{where(plan)}: transformers refused the engine settings ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]})") from None

    cache, resolved = manager.batch_processor.cache, manager.continuous_batching_config
    if cache.num_blocks < plan.num_blocks or cache.max_batch_tokens != plan.contract.limits.max_num_tokens:
        raise ForgeError(f"{where(plan)}: transformers built {cache.num_blocks} KV blocks and a "
                         f"{cache.max_batch_tokens}-token step; the plan says {plan.num_blocks} blocks and "
                         f"{plan.contract.limits.max_num_tokens} tokens")
    info = {
        "backend": "transformers", "card": plan.card_id, "device": device, "dtype": dtype,
        "attn_implementation": section.attn_implementation, "weights": weights, "sampling": section.sampling,
        "eos_token_id": eos, "continuous_batching_config": cb_kwargs,
        "resolved": {  # what transformers made of it, read back after the cache was built
            "num_blocks": int(cache.num_blocks), "max_batch_tokens": int(cache.max_batch_tokens),
            "page_size": resolved.page_size, "max_requests_per_batch": resolved.max_requests_per_batch,
            "max_blocks_per_request": resolved.max_blocks_per_request,
            "use_cuda_graph": list(resolved.cuda_graph_booleans), "use_async_batching": resolved.use_async_batching,
            "max_memory_percent": resolved.max_memory_percent, "prefix_sharing": bool(cache.use_prefix_sharing),
        },
        "generation_config": gen_kwargs,
    }
    engine = TransformersEngine(plan, section, model, tokenizer, manager, device=device, eos=eos, info=info,
                                guides=guides, no_guides_why=no_guides_why)
    manager.start()
    return engine
