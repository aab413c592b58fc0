"""What one TensorRT-LLM release offers forge, as plain data: its version, the fields of the LLM
API's argument models, whether it still ships the Executor, whether it honours a per-request seed.

The backend builds a Release from the installed package at load (install.installed_release); tests
build them from the field lists recorded from TensorRT-LLM's sources (tests/engines/trtllm/fields/);
planning without TensorRT-LLM uses `Release.unchecked()`. Pure: never imports tensorrt_llm."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

# The argument models whose fields forge checks before passing one (class name -> where the LLM API
# exports it).
ARGUMENT_MODELS = (
    "TorchLlmArgs",
    "KvCacheConfig",
    "SchedulerConfig",
    "CudaGraphConfig",
    "SamplingParams",
)
# The TensorRT backend (engine directories, the nanobind Executor) ships in releases up to 1.2.x and
# is removed on main (NVIDIA/TensorRT-LLM#15918, #16369); the 1.2.x line is the last with it.
LAST_EXECUTOR_RELEASE = (1, 2)


@dataclass(frozen=True)
class Release:
    version: str
    # class name -> the names of its fields; None: not checked (no TensorRT-LLM to ask), every field
    # passed
    fields: Optional[Mapping[str, frozenset[str]]]
    has_executor: bool
    per_request_seed: bool

    @classmethod
    def unchecked(cls) -> "Release":
        """For planning on a machine without TensorRT-LLM: fields are not checked, the Executor is
        assumed (the backend checks it at load), and a per-request seed is assumed ignored (the safe
        side)."""
        return cls("not installed", None, has_executor=True, per_request_seed=False)

    @property
    def checked(self) -> bool:
        return self.fields is not None

    def has(self, model: str, field: str) -> bool:
        """Whether `model` (e.g. "KvCacheConfig") has `field` in this release (always True when
        unchecked)."""
        return self.fields is None or field in self.fields.get(model, frozenset())


def version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a TensorRT-LLM version string ('1.2.1', '1.3.0rc14',
    '1.2.0rc6.post3')."""
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    if not m:
        return ()
    return tuple(int(g) for g in m.groups(default="0"))


def ships_executor(version: str) -> bool:
    """True for releases of the 1.2.x line or older, the last that ship the TensorRT backend's
    Executor."""
    v = version_tuple(version)
    return bool(v) and v[:2] <= LAST_EXECUTOR_RELEASE


def model_field_names(model: Any) -> frozenset[str]:
    """The constructor fields of a pydantic model class (`model_fields`) or a dataclass (init
    fields)."""
    fields = getattr(model, "model_fields", None)
    if isinstance(fields, Mapping):
        return frozenset(fields)
    if dataclasses.is_dataclass(model):
        return frozenset(f.name for f in dataclasses.fields(model) if f.init)
    return frozenset()


def release_from_models(version: str, models: Mapping[str, Any], *, has_executor: bool,
                        per_request_seed: bool) -> Release:
    """A Release from the installed argument model classes (name -> class; a missing class has no
    fields)."""
    return Release(
        version,
        {
            name: model_field_names(models[name]) if name in models else frozenset()
            for name in ARGUMENT_MODELS
        },
        has_executor=has_executor,
        per_request_seed=per_request_seed,
    )
