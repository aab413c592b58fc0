"""The `trtllm:` section of a contract: TensorRT-LLM scheduling switches the contract must state.

Each one changes admission, the token budget per step or the response rate, and each has a default
in TensorRT-LLM's TorchLlmArgs that forge will not inherit silently, so none has a default here: a
checkpoint contract of backend trtllm without the section, or with a field missing, is refused like
a contract without limits. The engine-directory (Executor) path has none of these knobs, so the
section is refused there. Pure: imports nothing from TensorRT-LLM."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

SECTION = "trtllm"


class TrtllmSection(BaseModel):
    """Switches of TensorRT-LLM's PyTorch path (TorchLlmArgs / SchedulerConfig), all stated by the contract."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    prefix_aware_scheduling: bool = Field(
        description="SchedulerConfig.enable_prefix_aware_scheduling (TensorRT-LLM main: default "
                    "true): the scheduler "
        "uses KV prefix-reuse estimates for admission, duplicate-request deferral and the token "
        "budget of a step. "
        "Independent of kv_cache.block_reuse. false where the release has no such field")
    overlap_scheduler: bool = Field(
        description="the overlap scheduler (TorchLlmArgs.disable_overlap_scheduler = not this; "
                    "TensorRT-LLM's default "
        "is on): the next batch is prepared while the current one runs on the GPU, so a request "
        "finishes one step "
        "later than its last token and stats' `iter` is stamped one loop early")
    stream_interval: int = Field(
        gt=0, le=1024, description="TorchLlmArgs.stream_interval (TensorRT-LLM's default 1): steps "
                                   "between two "
        "streamed responses of a request. 1 = one response per token per request; larger cuts "
        "per-token host work "
        "at large batches but forge sees new tokens (and cancels) only every N steps")
