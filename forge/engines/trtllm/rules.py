"""What forge's own checks of a contract file ask of TensorRT-LLM (the trtllm Backend's
contract_rules and artifact_checks, run on every contract whatever its backend, in their place among
forge's rules): a trtllm target is a GPU, and an engine directory is TensorRT-LLM's artifact,
holding no tokenizer, checked against its files (engine_dir.py). Reads only files: TensorRT-LLM is
not needed."""
from __future__ import annotations

from forge.config.models import Contract
from forge.engines.trtllm.engine_dir import check_engine_dir
from forge.errors import Problem

BACKEND = "trtllm"


def gpu_target_and_engine_dir(c: Contract, file: str) -> list[Problem]:
    """A trtllm contract targets a GPU; a contract naming an engine directory is a trtllm one with a
    tokenizer."""
    out = []
    if c.backend == BACKEND and c.target.kind != "gpu":
        out.append(Problem(file, "$.target.kind", "TensorRT-LLM runs only on NVIDIA GPUs; the "
                                                  "target must be gpu"))
    if c.artifact.engine_dir is not None and c.artifact.tokenizer is None:
        out.append(Problem(file, "$.artifact.tokenizer",
                           "a TensorRT-LLM engine directory holds no tokenizer; name the tokenizer "
                           "directory"))
    if c.artifact.engine_dir is not None and c.backend != BACKEND:
        out.append(Problem(file, "$.artifact.engine_dir",
                           f"an engine directory is a TensorRT-LLM artifact; backend {c.backend} "
                           "loads a checkpoint"))
    return out


def engine_dir_matches(c: Contract, file: str) -> list[Problem]:
    """A contract naming an engine directory, against the directory's config.json and rank files."""
    return [] if c.artifact.engine_dir is None else check_engine_dir(c, file)
