"""The installed TensorRT-LLM: importing its modules (one line naming what is missing or broken,
never a traceback) and reading what the installed release offers (`installed_release`). Imports
tensorrt_llm only when called."""
from __future__ import annotations

import importlib
from typing import Any

from forge.engines.trtllm.release import Release, release_from_models
from forge.errors import EngineUnavailable

INSTALL_HINT = ("backend 'trtllm' needs TensorRT-LLM on Linux with an NVIDIA GPU and driver: pip "
                "install "
                "tensorrt-llm (an engine_dir needs a release <= 1.2.x, the last with the Executor "
                "API)")

def optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception:   # absent in this release (or broken): the caller treats it as "not offered"
        return None


def installed_release() -> Release:
    """What the installed TensorRT-LLM offers: its version, the fields of the LLM API's argument
    models (`model_fields`), whether it ships the Executor, whether its TorchSampler honours a
    per-request seed."""
    version = str(getattr(require("tensorrt_llm"), "__version__", "unknown"))
    llmapi, llm_args = optional("tensorrt_llm.llmapi"), optional("tensorrt_llm.llmapi.llm_args")
    models = {}
    for name in (
        "TorchLlmArgs",
        "KvCacheConfig",
        "SchedulerConfig",
        "CudaGraphConfig",
        "SamplingParams",
    ):
        cls = getattr(llmapi, name, None) or getattr(llm_args, name, None)
        if cls is not None:
            models[name] = cls
    executor = optional("tensorrt_llm.bindings.executor")
    # per-request seeds came with NVIDIA/TensorRT-LLM#17172, whose TorchSampler keeps them in
    # _SeedManager
    sampler = optional("tensorrt_llm._torch.pyexecutor.sampler")
    return release_from_models(version, models, has_executor=hasattr(executor, "Executor"),
                               per_request_seed=hasattr(sampler, "_SeedManager"))


def require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EngineUnavailable(f"{INSTALL_HINT} ({e})") from None
    except Exception as e:  # a broken CUDA stack fails in many ways; say which, in one line
        raise EngineUnavailable(
            f"TensorRT-LLM is installed but failed to import: {first_line(e)}"
        ) from None


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
