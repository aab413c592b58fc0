"""The `transformers:` contract section: backend options of a transformers tier. The contract's
limits and kv_cache size the engine; these only choose how it runs. Every default is stated here and
reported by the engine's describe(). Imports nothing heavy (the plugin module and the hf helpers
both read it)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

BACKEND = "transformers"
# transformers 5.24's q_padding_interval_size, stated in the section rather than inherited
Q_PADDING_PRESET = 64


class TransformersSection(BaseModel):
    """Backend options of a contract (`transformers:`). The contract's limits and kv_cache size the engine; these
    only choose how it runs. Every default is stated here and reported by the engine's describe()."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = Field(
        None, description="weights and activations dtype; default: the contract's "
                          "precision.weights. transformers "
        "keeps the KV cache in this dtype too, so precision.kv_cache must name the same one")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flash_attention_3"] = Field(
        "sdpa", description="attention kernels; used as given (transformers' auto-switch to flash "
                            "is turned off). "
        "flash_* need the flash-attn package and a GPU, and enable the decode fast path")
    scheduler: Literal["fifo", "prefill_first"] = Field(
        "fifo", description="fifo schedules decoding sequences before new prefills, so sequences "
                            "in flight finish and "
        "free their KV blocks first (steady throughput, bounded latency for admitted work); "
        "prefill_first favours "
        "starting new prompts")
    safety_margin: float = Field(
        0.15, ge=0.0, lt=1.0, description="below this fraction of free KV blocks no new prefill is "
                                          "scheduled, so "
        "running sequences are not evicted; 0.15 is transformers' fifo value, stated here rather "
        "than inherited")
    sampling: Literal["per_request", "greedy"] = Field(
        "per_request", description="per_request: each request's temperature/top_p/top_k is "
                                   "honoured (temperature 0 "
        "runs as top_k=1); greedy: the engine only decodes greedily and refuses requests asking "
        "for temperature > 0 "
        "(slightly cheaper: no logits processing)")
    seed: int = Field(0, ge=0, description="the engine-wide seed (model initialisation and "
                                           "unseeded sampling; a "
                      "request's own seed is honoured on the eager loop, see "
                      "forge/engines/transformers/seeded.py)")
    max_waiting: Optional[int] = Field(
        None, gt=0, description="requests accepted beyond limits.max_batch_size before submit "
                                "raises EngineBusy; "
        "default: limits.max_batch_size (the engine holds at most twice its slots)")
    use_cuda_graph: bool = Field(False, description="CUDA graphs for the forward passes (GPU only; "
                                                    "pays off with "
                                 "flash attention, where no attention mask is needed)")
    async_batching: bool = Field(False, description="double-buffered batches that hide CPU "
                                                    "overhead (GPU only; "
                                 "doubles the IO buffers' memory)")
    compile_level: int = Field(0, ge=0, le=3, description="torch.compile level for the forward "
                                                          "passes: 0 off, 1-3 "
                               "are transformers' default_compile_level presets (longer warm-up)")
    graph_q_padding: int = Field(
        Q_PADDING_PRESET, ge=8, le=65536,
        description="with use_cuda_graph or compile_level: a step's query tokens are padded up to "
                    "a multiple of this "
        "(at most limits.max_num_tokens), and a graph is captured the first time each padded size "
        "comes up (per KV "
        "size and longest key); larger means fewer captures and more padded tokens in every step. "
        "64 is "
        "transformers 5.24's preset, stated here rather than inherited")
    graph_shape_cache: Optional[str] = Field(
        None, description="with use_cuda_graph: a folder (relative to this contract) where the "
                          "engine keeps the CUDA "
        "graph shapes its geometry meets, one file per geometry "
        "(CONTRACT-bBUDGET-qPADDING-pPOOL.jsonl: one JSON "
        "[query tokens, KV tokens read, longest key] per line). At load the engine captures every "
        "shape in its file "
        "before its card reports ready (at most 240 s); when it stops it adds the shapes it met, "
        "so the next load "
        "captures them too. Without it each shape is captured the first time a job meets it "
        "(forge/engines/transformers/graph_shapes.py)", json_schema_extra={"forge_path": True})
    hidden_pooling: Literal["mean", "last"] = Field(
        "mean", description="how want_hidden requests pool the final (normed) hidden states of the "
                            "prompt: mean over "
        "all prompt tokens, or the last token's")
