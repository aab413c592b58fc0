"""The typed form of the two user file formats. These pydantic models are the single source of
truth: the JSON Schemas in docs/schemas/ are generated from them, and the loader builds them after
validating. Every model forbids unknown keys. Fields of `limits` and `kv_cache` have NO defaults:
forge refuses a contract that leaves the token budget or the cache sizing to an engine's default."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from forge.config.units import parse_bytes

PositiveInt = Annotated[int, Field(gt=0)]
# What every engine represents for a count of sequences or tokens (int32): past it a limit validated
# and failed only when the engine loaded.
EngineCount = Annotated[int, Field(gt=0, le=2**31 - 1)]
MAX_REPLICAS = 16          # engine processes of one tier on one card (cards[].replicas)
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
ComputeCapability = Annotated[str, Field(pattern=r"^[0-9]{1,2}\.[0-9]$")]
# "" would name the contract's own folder (or nothing at all)
PathText = Annotated[str, Field(min_length=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ----------------------------------------------------------------------------- contract
class ModelGeometry(Strict):
    """The model's shape: what the KV math and the engine cross-checks read."""

    architecture: str = Field(min_length=1, description="HF architecture name, e.g. "
                                                        "LlamaForCausalLM")
    num_layers: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab_size: PositiveInt
    weights_gib: float = Field(ge=0, description="resident weight memory on the card, GiB")


class Artifact(Strict):
    """Where the engine comes from. Paths are relative to the contract file."""

    engine_dir: Optional[PathText] = Field(None, description="TensorRT-LLM engine directory "
                                                             "(config.json + rank*.engine)")
    checkpoint: Optional[PathText] = Field(None, description="HF-style checkpoint directory "
                                                             "(config.json [+ weights])")
    tokenizer: Optional[PathText] = Field(None, description="tokenizer directory; defaults to the "
                                                            "checkpoint directory")
    random_weights: bool = Field(
        False, description="build random ('dummy') weights from the checkpoint's config.json — "
                           "throughput work only; "
        "never a fallback for missing weights")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> "Artifact":
        if (self.engine_dir is None) == (self.checkpoint is None):
            raise ValueError("exactly one of engine_dir | checkpoint must be given")
        if self.random_weights and self.checkpoint is None:
            raise ValueError("random_weights needs a checkpoint (its config.json gives the shape)")
        return self


class Precision(Strict):
    weights: Literal["fp32", "bf16", "fp16", "fp8", "int4"]
    kv_cache: Literal["fp32", "bf16", "fp16", "fp8", "int8"]


class Limits(Strict):
    """The engine's token geometry. None of these has a default."""

    max_batch_size: EngineCount = Field(description="sequences in flight (slots)")
    max_num_tokens: EngineCount = Field(description="THE TOKEN BUDGET: tokens the engine may "
                                                    "process per step")
    max_input_len: EngineCount
    max_output_len: EngineCount


ByteSize = Union[
    Annotated[int, Field(ge=0)],
    Annotated[str, Field(pattern=r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B|B)?\s*$")],
]


class KvCache(Strict):
    """Cache sizing. None of these has a default; exactly one of free_gpu_memory_fraction | max_tokens."""

    tokens_per_block: PositiveInt
    free_gpu_memory_fraction: Optional[float] = Field(None, gt=0, le=1)
    max_tokens: Optional[PositiveInt] = None
    host_cache_size: ByteSize = Field(description='bytes, or a size such as "8GiB"; 0 means no '
                                                  'host offload')
    block_reuse: bool

    @field_validator("tokens_per_block")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"tokens_per_block must be a power of two, got {v}")
        return v

    @model_validator(mode="after")
    def _one_sizing(self) -> "KvCache":
        if (self.free_gpu_memory_fraction is None) == (self.max_tokens is None):
            raise ValueError("exactly one of free_gpu_memory_fraction | max_tokens must be given")
        return self

    @property
    def host_cache_bytes(self) -> int:
        return parse_bytes(self.host_cache_size)


class Target(Strict):
    """Where the engine may run. A GPU engine runs only on the compute capability it was built for."""

    kind: Literal["gpu", "cpu"] = "gpu"
    compute_capability: Optional[ComputeCapability] = None

    @model_validator(mode="after")
    def _cc_for_gpu(self) -> "Target":
        if self.kind == "gpu" and self.compute_capability is None:
            raise ValueError("a gpu target needs compute_capability")
        if self.kind == "cpu" and self.compute_capability is not None:
            raise ValueError("a cpu target has no compute_capability")
        return self


class Contract(Strict):
    """One engine tier: engine_contracts/<name>.yaml."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    contract: Name
    backend: Name
    model: ModelGeometry
    artifact: Artifact
    precision: Precision
    limits: Limits
    kv_cache: KvCache
    target: Target
    # Backend-owned sections (e.g. `transformers:`), each registered Backend's `section`.
    sections: dict[str, Any] = Field(default_factory=dict, exclude=True)

    _source: Optional[Path] = PrivateAttr(None)

    @property
    def source(self) -> Optional[Path]:
        """The file this contract was loaded from (None when built in code)."""
        return self._source

    def resolve(self, rel: Optional[str]) -> Optional[Path]:
        """A path named in this contract, resolved against the contract file's folder."""
        if rel is None:
            return None
        base = self._source.parent if self._source else Path.cwd()
        return (base / rel).resolve()


# ----------------------------------------------------------------------------- node
class Host(Strict):
    memory_gib: float = Field(gt=0)
    cpu_cores: PositiveInt


class Card(Strict):
    index: Annotated[int, Field(ge=0)]
    kind: Literal["gpu", "cpu"]
    model: str = Field(min_length=1, description="as NVML reports it, e.g. 'NVIDIA H200'; 'cpu' "
                                                 "for a CPU card")
    memory_gib: float = Field(gt=0)
    compute_capability: Optional[ComputeCapability] = None
    engine: Name = Field(description="the contract this card runs")
    replicas: int = Field(
        1, ge=1, le=MAX_REPLICAS, description="engines of this card's contract on the card, each "
                                              "its own process "
        "with its own weights and KV pool (see docs/node-descriptions.md); default 1")
    cores: Optional[list[Annotated[int, Field(ge=0)]]] = Field(
        None, min_length=1, description="host core ids this card's engine processes run on (its "
                                        "card worker and "
        "every process its engine starts); default: every core the node may use. On a CPU host "
        "this is what makes "
        "two CPU cards two devices instead of two processes on the same cores")

    @model_validator(mode="after")
    def _cc_for_gpu(self) -> "Card":
        if self.kind == "gpu" and self.compute_capability is None:
            raise ValueError("a gpu card needs compute_capability")
        if self.kind == "cpu" and self.compute_capability is not None:
            raise ValueError("a cpu card has no compute_capability")
        return self


class Metrics(Strict):
    port: Annotated[int, Field(ge=0, le=65535)] = Field(description="Prometheus /metrics port; 0 "
                                                                    "picks a free one")
    host: str = "127.0.0.1"


class Control(Strict):
    """The control endpoint deploy clients talk to. Loopback by default; elsewhere a token is required."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8470
    token_env: str = Field("FORGE_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                           description="environment variable holding the bearer token")


class NodeDescription(Strict):
    """A node description: node_descriptions/<name>.yaml."""

    node: Name
    contracts: Union[PathText, list[PathText]] = Field(description="a folder of contracts, or a "
                                                                   "list of contract files")
    host: Host
    cards: list[Card] = Field(min_length=1)
    metrics: Metrics
    control: Control = Field(default_factory=Control)

    _source: Optional[Path] = PrivateAttr(None)

    @property
    def source(self) -> Optional[Path]:
        return self._source
