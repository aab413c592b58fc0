"""Load the tokenizer and the model of a transformers-backend contract, offline, exactly as the
contract says.

Missing weights are an error naming the path, unless the contract asks for random weights
(artifact.random_weights), which are built from config.json and logged: never a silent fallback."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Sequence

from forge.config.plan import CardPlan
from forge.engines.transformers.sizing import where
from forge.errors import ForgeError, display_path

log = logging.getLogger("forge.engines.transformers")

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class HFTokenizer:
    """The engine's tokenizer (what the broker measures with). encode follows the tokenizer's own
    convention for a prompt, i.e. adds BOS where the model's tokenizer does (Llama-style ones, the
    embedded model's included) and nothing else; decode drops special tokens."""

    def __init__(self, hf):
        self.hf = hf
        self.eos_token_id: Optional[int] = hf.eos_token_id
        self.bos_token_id: Optional[int] = hf.bos_token_id
        self.pad_token_id: Optional[int] = hf.pad_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)


def _checkpoint_dir(plan: CardPlan) -> Path:
    ckpt = plan.contract.resolve(plan.contract.artifact.checkpoint)
    if ckpt is None:
        raise ForgeError(f"{where(plan)}::$.artifact: the transformers backend needs "
                         "artifact.checkpoint")
    if not (ckpt / "config.json").is_file():
        raise ForgeError(f"{display_path(ckpt)}: no config.json (artifact.checkpoint of "
                         f"{where(plan)})")
    return ckpt


def load_tokenizer(plan: CardPlan) -> HFTokenizer:
    from transformers import AutoTokenizer

    art = plan.contract.artifact
    path = plan.contract.resolve(art.tokenizer) if art.tokenizer else _checkpoint_dir(plan)
    try:
        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise ForgeError(f"{display_path(path)}: cannot load a tokenizer ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]})") from None
    return HFTokenizer(hf)


def _check_geometry(plan: CardPlan, cfg) -> None:
    """The engine is sized from the contract's geometry; a checkpoint that disagrees would make the
    plan a lie."""
    m = plan.contract.model
    text = cfg.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    actual = {"num_layers": text.num_hidden_layers, "num_kv_heads": kv_heads, "head_dim": head_dim,
              "vocab_size": text.vocab_size}
    for key, value in actual.items():
        if getattr(m, key) != value:
            raise ForgeError(f"{where(plan)}::$.model.{key}: contract says {getattr(m, key)}, the "
                             "checkpoint's "
                             f"config.json says {value}")


def load_model(plan: CardPlan, *, device: str, dtype: str, attn_implementation: str, seed: int):
    """Returns (model, weights) where weights is "checkpoint" or "random"."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # forge reports loading itself; no tqdm bars on the user's terminal
    hf_logging.disable_progress_bar()
    ckpt = _checkpoint_dir(plan)
    torch_dtype = getattr(torch, dtype)
    try:
        cfg = AutoConfig.from_pretrained(str(ckpt), local_files_only=True)
    except Exception as exc:
        raise ForgeError(
            f"{display_path(ckpt / 'config.json')}: {' '.join(str(exc).split())[:300]}"
        ) from None
    _check_geometry(plan, cfg)
    if plan.contract.artifact.random_weights:
        log.warning("%s: building RANDOM weights from %s (artifact.random_weights: true); outputs "
                    "are noise",
                    plan.contract.contract, display_path(ckpt / "config.json"))
        torch.manual_seed(seed)
        cfg._attn_implementation = attn_implementation
        # built and initialised on the card: no host-side copy of billions of weights
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                cfg, dtype=torch_dtype, attn_implementation=attn_implementation
            )
        model = model.to(device)
        return model.eval(), "random"
    if not any((ckpt / name).is_file() for name in WEIGHT_FILES):
        raise ForgeError(f"{display_path(ckpt)}: no model weights "
                         f"({' or '.join(WEIGHT_FILES[::2])}); set "
                         f"artifact.random_weights: true in {where(plan)} to run on random weights")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(ckpt),
            local_files_only=True,
            dtype=torch_dtype,
            attn_implementation=attn_implementation,
        ).to(device)
    except Exception as exc:
        raise ForgeError(f"{display_path(ckpt)}: cannot load the model ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:300]})") from None
    return model.eval(), "checkpoint"
