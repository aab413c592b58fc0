"""Check an installed vLLM against what forge's vLLM backend uses, without loading a model: every name forge imports,
every engine method and attribute it calls, every engine argument forge's mapping passes (as EngineArgs fields), the
contract's attention backend, and which flash-attention versions this card can run. One line per finding; exit 1 on
any missing piece. Run it after an offline install (docs/vllm.md, "A GPU host with no package registry"):

    python scripts/check_vllm_api.py docs/bench/gpu-vllm/node-h100-llama-1p5b-vllm.yaml"""
from __future__ import annotations

import dataclasses
import importlib
import sys

NAMES = [("vllm", "LLM"), ("vllm", "EngineArgs"), ("vllm", "SamplingParams"), ("vllm.inputs", "TokensPrompt"),
         ("vllm.sampling_params", "RequestOutputKind"), ("vllm.sampling_params", "StructuredOutputsParams"),
         ("vllm.config", "StructuredOutputsConfig"), ("vllm.engine.arg_utils", "EngineArgs"),
         ("vllm.v1.engine.llm_engine", "LLMEngine"), ("vllm.v1.metrics.loggers", "PrometheusStatLogger")]
ENGINE_METHODS = ("from_engine_args", "add_request", "step", "abort_request")
LLM_METHODS = ("generate", "reset_prefix_cache", "get_metrics")
LOGGER_METHODS = ("record", "record_admission_rejection")


def main(node_path: str) -> int:
    from forge.config.load import load_node
    from forge.engines.vllm import factory, mapping

    missing = []
    vllm = factory.import_vllm()
    print(f"vllm {vllm.__version__} at {vllm.__file__}")
    for module, name in NAMES:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{module}.{name}: {exc}")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    from vllm import LLM
    missing += [f"LLMEngine.{m}" for m in ENGINE_METHODS if not hasattr(LLMEngine, m)]
    missing += [f"LLM.{m}" for m in LLM_METHODS if not hasattr(LLM, m)]
    absent_logger = [m for m in LOGGER_METHODS if not hasattr(PrometheusStatLogger, m)]
    if absent_logger:       # forge's logger defines both itself; a base without them only matters for vLLM's calls
        print(f"note: PrometheusStatLogger has no {', '.join(absent_logger)} (forge's logger defines it)")
    plan = load_node(node_path).plans[0]
    arguments = mapping.engine_arguments(plan.contract, plan)
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    missing += [f"EngineArgs.{k} (forge maps a contract field to it)" for k in arguments if k not in fields]
    factory.engine_args(arguments)              # the nested configs build as vLLM's own objects
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = arguments["attention_backend"]
    if backend not in AttentionBackendEnum.__members__:
        missing.append(f"attention backend {backend} (vLLM has {', '.join(AttentionBackendEnum.__members__)})")
    try:
        from vllm.vllm_flash_attn.flash_attn_interface import fa_version_unsupported_reason, is_fa_version_supported

        for version in (2, 3):
            ok = is_fa_version_supported(version)
            print(f"flash-attention {version}: {'supported' if ok else fa_version_unsupported_reason(version)}")
    except ImportError as exc:
        print(f"flash-attention interface: {exc}")
    for line in missing:
        print(f"MISSING {line}")
    print(f"{len(NAMES)} names, {len(ENGINE_METHODS) + len(LLM_METHODS)} methods, {len(arguments)} engine arguments "
          f"checked: {'all present' if not missing else f'{len(missing)} missing'}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
