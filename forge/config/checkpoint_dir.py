"""Cross-checks of a contract against an HF-style checkpoint directory and its tokenizer.

Reads config.json and lists files; loads no weights and needs neither torch nor transformers."""
from __future__ import annotations

from pathlib import Path

from forge.config.files import FileRefused, read_json
from forge.config.models import Contract
from forge.errors import Problem

WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def geometry(cfg: dict) -> dict:
    """The text model's shape from an HF config (multimodal configs nest it under text_config)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim")
    if (
        head_dim is None
        and isinstance(text.get("hidden_size"), int)
        and isinstance(heads, int)
        and heads
    ):
        head_dim = text["hidden_size"] // heads
    return {"num_layers": text.get("num_hidden_layers"),
            "num_attention_heads": heads,
            "num_kv_heads": text.get("num_key_value_heads", heads),
            "head_dim": head_dim,
            "vocab_size": text.get("vocab_size", cfg.get("vocab_size")),
            "max_position_embeddings": text.get("max_position_embeddings")}


_HF_KEYS = {
    "num_layers": "num_hidden_layers",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "vocab_size": "vocab_size",
}


def check_checkpoint(contract: Contract, file: str) -> list[Problem]:
    """Every disagreement between a contract and its checkpoint's config.json; weights must
    exist."""
    where = "$.artifact.checkpoint"
    ckpt = contract.resolve(contract.artifact.checkpoint)
    if ckpt is None or not ckpt.is_dir():
        return [Problem(file, where, f"checkpoint directory {ckpt} does not exist")]
    try:
        cfg = read_json(ckpt / "config.json")
    except FileRefused as e:
        return [Problem(file, where, f"{ckpt / 'config.json'}: {e}")]
    out: list[Problem] = []
    m = contract.model
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and m.architecture not in archs:
        out.append(Problem(file, "$.model.architecture",
                           f"the checkpoint is a {', '.join(map(str, archs))}; the contract says "
                           f"{m.architecture}"))
    geo = geometry(cfg)
    for field, hf_key in _HF_KEYS.items():
        have = geo[field]
        if have is None:
            out.append(Problem(file, f"$.model.{field}", f"checkpoint config.json has no {hf_key}"))
        elif have != getattr(m, field):
            out.append(Problem(file, f"$.model.{field}",
                               f"the checkpoint has {hf_key} {have}; the contract says "
                               f"{getattr(m, field)}"))
    lim = contract.limits
    maxpos = geo["max_position_embeddings"]
    if isinstance(maxpos, int) and lim.max_input_len + lim.max_output_len > maxpos:
        out.append(Problem(file, "$.limits.max_input_len",
                           "max_input_len + max_output_len = "
                           f"{lim.max_input_len + lim.max_output_len} exceeds the "
                           f"model's max_position_embeddings {maxpos}"))
    if not contract.artifact.random_weights and not any(any(ckpt.glob(g)) for g in WEIGHT_GLOBS):
        out.append(Problem(file, where, f"no weight files ({', '.join(WEIGHT_GLOBS)}) in {ckpt}; "
                           "random_weights: true is only for throughput work and never a fallback"))
    return out


def check_tokenizer(contract: Contract, file: str) -> list[Problem]:
    """The tokenizer folder (artifact.tokenizer, else the checkpoint) must hold tokenizer files."""
    art = contract.artifact
    if art.tokenizer is None and art.checkpoint is None:
        return []           # an engine directory without a tokenizer: nothing to check here
    where = "$.artifact.tokenizer" if art.tokenizer is not None else "$.artifact.checkpoint"
    folder: Path = contract.resolve(art.tokenizer if art.tokenizer is not None else art.checkpoint)
    if not folder.is_dir():
        if art.tokenizer is None:
            return []       # the missing checkpoint is reported by check_checkpoint
        return [Problem(file, where, f"tokenizer directory {folder} does not exist")]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return [Problem(file, where, f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in "
                                     f"{folder}")]
    return []
