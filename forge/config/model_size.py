"""What a checkpoint's config.json says about a model's size, read strictly: every number `forge
contract new` uses is a whole positive number within a sane bound (a bool, a float, a 5,000-digit
integer or a negative one is refused with its file and JSON path), and the parameter count a dense
decoder of that geometry has.

The count is the one a Llama-style decoder (Llama, Mistral, Qwen2, Gemma and the like) has: token
embeddings (vocab x hidden), per layer the q/k/v/o projections (hidden x heads x head_dim for q and
o, hidden x kv_heads x head_dim for k and v, plus biases where the config says so), a gated MLP (3 x
hidden x intermediate) and two norms (2 x hidden), a final norm, and an lm_head unless the
embeddings are tied. It is what sizes a card before the weights are downloaded; where *.safetensors
headers are present their count is used and the two are compared."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from forge.config.files import shown
from forge.config.messages import json_path
from forge.errors import ForgeError

# Far above any real model's, far below what would overflow the arithmetic downstream (int32 in the
# engines).
BOUNDS = {
    "num_hidden_layers": 4096,
    "num_attention_heads": 16384,
    "num_key_value_heads": 16384,
    "head_dim": 65536,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 22,
    "vocab_size": 1 << 26,
    "max_position_embeddings": (1 << 31) - 1,
}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
QKV_BIAS_MODEL_TYPES = ("qwen2",)       # Qwen2 has q/k/v biases its config does not state


class LongNumber:
    """A JSON integer of more digits than any size has (json.loads parse_int): kept as its length,
    so the field holding it is named instead of Python refusing to convert the whole file."""

    MAX_DIGITS = 30

    def __init__(self, literal: str):
        self.digits = len(literal.lstrip("-"))

    @classmethod
    def parse_int(cls, literal: str):
        return int(literal) if len(literal) <= cls.MAX_DIGITS else cls(literal)


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    hidden_size: Optional[int]
    intermediate_size: Optional[int]
    max_position: Optional[int]
    tied_embeddings: bool
    attention_biases: str           # "" | "qkv" (Qwen2) | "qkvo" (attention_bias: true)
    mlp_bias: bool
    moe_key: Optional[str]          # the key that marks a mixture-of-experts config, if any
    text_path: tuple                # () or ("text_config",): where the text model's keys are


class _Reader:
    def __init__(self, cfg: dict, file: Path):
        self.cfg, self.file = cfg, file
        nested = cfg.get("text_config")
        self.text_path: tuple = ("text_config",) if isinstance(nested, dict) else ()
        self.text = nested if isinstance(nested, dict) else cfg

    def refuse(self, parts: tuple, message: str) -> ForgeError:
        return ForgeError(f"{shown(self.file)}::{json_path(parts)}: {message}")

    def count(self, key: str, *, required: bool, fallback: Optional[int] = None) -> Optional[int]:
        """A whole number in 1..BOUNDS[key] at the text model's key (vocab_size may sit at the top
        level too)."""
        where, value = self.text_path + (key,), self.text.get(key)
        if value is None and key == "vocab_size" and self.text_path:
            where, value = (key,), self.cfg.get(key)
        if value is None:
            if fallback is not None or not required:
                return fallback
            raise self.refuse(where, "missing; a contract needs it")
        if isinstance(value, LongNumber):
            raise self.refuse(where, f"{_shape_of(value)} is outside 1..{BOUNDS[key]:,}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.refuse(where, f"{_shape_of(value)} is not a whole number")
        if not 1 <= value <= BOUNDS[key]:
            raise self.refuse(where, f"{_short(value)} is outside 1..{BOUNDS[key]:,}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.text.get(key, self.cfg.get(key, default))
        if not isinstance(value, bool):
            raise self.refuse(self.text_path + (key,), f"{_shape_of(value)} is not true or false")
        return value


def _short(value: int) -> str:
    text = str(value) if -10**30 < value < 10**30 else f"a {len(str(abs(value)))}-digit number"
    return text


def _shape_of(value) -> str:
    if isinstance(value, LongNumber):
        return f"a {value.digits:,}-digit number"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return _short(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return f"a string ({len(value)} characters)"
    return f"a {type(value).__name__}"


def read_shape(cfg: dict, file: Path) -> ModelShape:
    """The model's shape from config.json, or a ForgeError naming the file and the field at
    fault."""
    r = _Reader(cfg, file)
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise r.refuse(("architectures",), "missing or empty; a contract names the model's class "
                                           "(e.g. "
                       "[\"LlamaForCausalLM\"])")
    arch = archs[0]
    if not isinstance(arch, str) or not arch.isidentifier() or len(arch) > 200:
        what = (
            _shape_of(arch)
            if not isinstance(arch, str)
            else ("empty" if not arch else repr(arch[:60]))
        )
        raise r.refuse(("architectures", 0), f"{what} is not a model class name (a Python "
                                             "identifier such as "
                       "LlamaForCausalLM)")
    heads = r.count("num_attention_heads", required=True)
    hidden = r.count("hidden_size", required=False)
    head_dim = r.count("head_dim", required=False)
    if head_dim is None:
        if hidden is None:
            raise r.refuse(r.text_path + ("head_dim",), "missing, and no hidden_size to derive it "
                                                        "from "
                           "(hidden_size / num_attention_heads)")
        if hidden % heads:
            raise r.refuse(r.text_path + ("hidden_size",), f"{hidden} is not a multiple of "
                                                           "num_attention_heads "
                           f"{heads}, and there is no head_dim")
        head_dim = hidden // heads
    kv_heads = r.count("num_key_value_heads", required=False, fallback=heads)
    if heads % kv_heads:
        raise r.refuse(r.text_path + ("num_key_value_heads",), f"{kv_heads} does not divide "
                                                               "num_attention_heads "
                       f"{heads}")
    model_type = cfg.get("model_type")
    return ModelShape(
        architecture=arch,
        num_layers=r.count("num_hidden_layers", required=True),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=r.count("vocab_size", required=True),
        hidden_size=hidden,
        intermediate_size=r.count("intermediate_size", required=False),
        max_position=r.count("max_position_embeddings", required=False),
        # transformers' PretrainedConfig default
        tied_embeddings=r.flag("tie_word_embeddings", True),
        attention_biases="qkvo"
        if r.flag("attention_bias", False)
        else "qkv"
        if model_type in QKV_BIAS_MODEL_TYPES
        else "",
        mlp_bias=r.flag("mlp_bias", False),
        moe_key=next((k for k in MOE_KEYS if r.text.get(k) not in (None, 0, 1)), None),
        text_path=r.text_path,
    )


@dataclass(frozen=True)
class GeometryCount:
    parameters: Optional[int]       # None: this geometry cannot be counted (why says why)
    why: str


def geometry_parameters(s: ModelShape) -> GeometryCount:
    """Parameters of a dense Llama-style decoder of this shape (module docstring), or why it cannot
    be counted."""
    prefix = "text_config." if s.text_path else ""
    if s.moe_key is not None:
        return GeometryCount(None, f"a mixture-of-experts config ({prefix}{s.moe_key}): forge "
                                   "counts dense decoders "
                             "only")
    missing = [
        k
        for k, v in (("hidden_size", s.hidden_size), ("intermediate_size", s.intermediate_size))
        if v is None
    ]
    if missing:
        return GeometryCount(None, f"config.json has no {' or '.join(prefix + k for k in missing)}")
    h, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_kv_heads * s.head_dim
    biases = {"": 0, "qkv": q + 2 * kv, "qkvo": q + 2 * kv + h}[s.attention_biases]
    attention = 2 * h * q + 2 * h * kv + biases
    mlp = 3 * h * s.intermediate_size + ((2 * s.intermediate_size + h) if s.mlp_bias else 0)
    per_layer = attention + mlp + 2 * h
    embeddings = s.vocab_size * h * (1 if s.tied_embeddings else 2)
    total = s.num_layers * per_layer + h + embeddings
    return GeometryCount(total, f"{s.num_layers} layers x {per_layer:,} (q/k/v/o {attention:,}, "
                                f"gated MLP {mlp:,}, "
                         f"norms {2 * h:,}) + final norm {h:,} + embeddings {s.vocab_size:,} x "
                         f"{h:,}"
                         + (" (tied with lm_head)" if s.tied_embeddings else " and an lm_head of "
                                                                             "the same size"))

