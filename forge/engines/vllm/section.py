"""The `vllm:` contract section: how vLLM runs a tier. Every field is required: vLLM picks each of
these by device, model or platform when it is not given, and forge refuses a tier that leaves them
to the engine.

The contract's limits and kv_cache size the engine (forge/engines/vllm/mapping.py); these only
choose how it runs."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# vLLM's structured-output backends (StructuredOutputsConfig.backend), "auto" left out: it picks one
# per request.
STRUCTURED_OUTPUT_BACKENDS = ("xgrammar", "guidance", "outlines", "lm-format-enforcer")


class VllmSection(BaseModel):
    """`vllm:` in a contract with `backend: vllm`. No field has a default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    enforce_eager: bool = Field(
        description="true: eager PyTorch (loads in seconds); false: torch.compile (and CUDA graphs "
                    "on GPUs), a long "
        "first load and a compile cache")
    attention_backend: str = Field(
        pattern=r"^[A-Z][A-Z0-9_]*$", description="vLLM's attention backend by its "
                                                  "AttentionBackendEnum name: "
        "CPU_ATTN on CPU; FLASH_ATTN, FLASHINFER, TRITON_ATTN, ... on GPUs")
    async_scheduling: bool = Field(
        description="schedule step N+1 while step N runs (GPU only: vLLM's CPU platform turns it "
                    "off, so a cpu "
        "target must say false)")
    chunked_prefill: bool = Field(
        description="split long prompts over steps within limits.max_num_tokens; false needs "
                    "max_num_tokens to hold "
        "a whole max_input_len + max_output_len sequence (vLLM's rule)")
    long_prefill_token_threshold: int = Field(
        ge=0, description="with chunked_prefill: a prompt chunk larger than this many tokens is "
                          "cut to it, so "
        "decodes keep their share of the budget; 0: no cut (chunks up to the whole budget)")
    kv_offloading_backend: Literal["native", "lmcache"] = Field(
        description="where kv_cache.host_cache_size offloads KV blocks: native (vLLM's CPU "
                    "offloading) or lmcache; "
        "unused when host_cache_size is 0 but still stated")
    structured_outputs_backend: Literal[
        "xgrammar", "guidance", "outlines", "lm-format-enforcer"
    ] = Field(
        description="the library that builds guided-output token masks (choice and JSON schema)"
    )
    stream_interval: int = Field(
        ge=1, description="decoded tokens between two progress reports of a request (1: every "
                          "token)")
    seed: int = Field(ge=0, description="the engine-wide seed; a request's own seed is honoured "
                                        "per request")
