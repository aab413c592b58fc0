"""The KV-cache quantization a checkpoint declares, as TensorRT-LLM's PyTorch path reads it, and the
check that it is the one the contract states.

With KvCacheConfig.dtype "auto" TensorRT-LLM keeps the checkpoint's own kv_cache_quant_algo
(llm_args.py, sync_quant_config_with_kv_cache_config_dtype): an FP8 checkpoint that declares an FP8
KV cache gets an FP8 cache whatever the contract says, and the pool holds twice the tokens the plan
counted. So forge reads the declaration and refuses a disagreement, naming both. Where TensorRT-LLM
reads it (tensorrt_llm/_torch/model_config.py, load_modelopt_quant_config / load_hf_quant_config):
  hf_quant_config.json  quantization.kv_cache_quant_algo (ModelOpt; a flat kv_cache_quant_algo also counts)
  config.json           quantization_config.kv_cache_quant_algo (ModelOpt inline)
                        quantization_config.kv_cache_scheme {type, num_bits} (compressed-tensors)
Reads two small JSON files; needs neither TensorRT-LLM nor torch."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from forge.config.files import FileRefused, read_json
from forge.config.models import Contract
from forge.errors import Problem

# TensorRT-LLM QuantAlgo names for a KV cache -> the contract's precision.kv_cache
KV_ALGO_TO_CONTRACT = {"FP8": "fp8", "INT8": "int8", "NVFP4": "nvfp4"}


class Declared:
    """What a checkpoint declares about its KV cache: algo None = nothing (16-bit, the model
    dtype)."""

    def __init__(self, algo: Optional[str], where: str):
        self.algo, self.where = algo, where

    @property
    def contract_dtype(self) -> Optional[str]:
        return (
            None
            if self.algo is None
            else KV_ALGO_TO_CONTRACT.get(self.algo.upper(), self.algo.lower())
        )


def _scheme_algo(scheme) -> Optional[str]:
    if not isinstance(scheme, dict):
        return None
    if scheme.get("num_bits") == 8:
        return (
            "FP8"
            if scheme.get("type") == "float"
            else "INT8"
            if scheme.get("type") == "int"
            else None
        )
    return f"{scheme.get('type')}{scheme.get('num_bits')}".upper()


def declared_kv_quant(checkpoint: Path) -> Declared:
    """The checkpoint's KV-cache quantization, where it was found. Raises FileRefused for an
    unreadable file."""
    hf_quant = checkpoint / "hf_quant_config.json"
    if hf_quant.is_file():
        cfg = read_json(hf_quant)
        inner = cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else cfg
        algo = inner.get("kv_cache_quant_algo")
        key = "quantization.kv_cache_quant_algo" if inner is not cfg else "kv_cache_quant_algo"
        return Declared(algo if isinstance(algo, str) else None, f"hf_quant_config.json {key} = "
                                                                 f"{algo!r}")
    config = checkpoint / "config.json"
    if not config.is_file():
        return Declared(None, "no config.json")
    qc = read_json(config).get("quantization_config")
    if not isinstance(qc, dict):
        return Declared(None, "config.json has no quantization_config")
    if isinstance(qc.get("kv_cache_quant_algo"), str):
        return Declared(qc["kv_cache_quant_algo"],
                        "config.json quantization_config.kv_cache_quant_algo = "
                        f"{qc['kv_cache_quant_algo']!r}")
    if qc.get("kv_cache_scheme") is not None:
        return Declared(_scheme_algo(qc["kv_cache_scheme"]),
                        "config.json quantization_config.kv_cache_scheme = "
                        f"{qc['kv_cache_scheme']!r}")
    return Declared(None, "config.json quantization_config declares no KV-cache quantization")


def kv_quant_problems(contract: Contract, where: str) -> list[Problem]:
    """A checkpoint contract whose checkpoint declares another KV-cache dtype than
    precision.kv_cache."""
    ckpt = contract.resolve(contract.artifact.checkpoint)
    if ckpt is None or not ckpt.is_dir():
        return []          # the core checks already refuse a missing checkpoint directory
    try:
        declared = declared_kv_quant(ckpt)
    except FileRefused as e:
        return [Problem(where, "$.artifact.checkpoint", "cannot read the checkpoint's "
                                                        f"quantization config: {e}")]
    want = contract.precision.kv_cache
    have = declared.contract_dtype
    if have is None and want in ("fp8", "int8"):
        # forge passes KvCacheConfig.dtype explicitly; TensorRT-LLM quantizes the cache itself
        return []
    if have is None or have == want:
        return []
    return [Problem(where, "$.precision.kv_cache",
                    f"the checkpoint declares its KV cache as {have} ({declared.where} in {ckpt}); "
                    "the contract says "
                    f"{want}: TensorRT-LLM would build the checkpoint's {have} cache. State "
                    f"kv_cache: {have} or use a "
                    "checkpoint without KV-cache quantization")]
