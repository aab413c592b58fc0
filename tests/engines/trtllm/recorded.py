"""The field lists recorded from TensorRT-LLM's sources (tests/engines/trtllm/fields/*.json), as
Releases.

Each file names the repository, file and commit it was read from. MAIN is TensorRT-LLM main's
llm_args.py (TorchLlmArgs, KvCacheConfig, SchedulerConfig, CudaGraphConfig) with SamplingParams from
the newest stored sampling_params.py (1.0.0rc4): the only versions of those files the source index
holds."""
from __future__ import annotations

import json
from pathlib import Path

from forge.engines.trtllm.release import ARGUMENT_MODELS, Release

FIELDS_DIR = Path(__file__).resolve().parent / "fields"


def recorded_files() -> dict[str, dict]:
    return {
        p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(FIELDS_DIR.glob("*.json"))
    }


def recorded_fields() -> dict[str, frozenset[str]]:
    """class name -> fields, merged over every recorded file (a class is recorded in exactly
    one)."""
    out: dict[str, frozenset[str]] = {}
    for name, data in recorded_files().items():
        for cls, entry in data["classes"].items():
            assert cls not in out, f"{cls} is recorded twice ({name})"
            out[cls] = frozenset(entry["fields"])
    return out


def main_release(
    *, per_request_seed: bool = True, drop: dict[str, set[str]] | None = None
) -> Release:
    """TensorRT-LLM main as recorded: no Executor. `drop` removes fields, to stand for an older
    release."""
    fields = recorded_fields()
    drop = drop or {}
    return Release(
        "main (recorded)",
        {m: fields.get(m, frozenset()) - drop.get(m, set()) for m in ARGUMENT_MODELS},
        has_executor=False,
        per_request_seed=per_request_seed,
    )
