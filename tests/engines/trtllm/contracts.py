"""What the trtllm backend's tests build on: a Llama-7B FP8 tier, a 32 GiB GPU card, a real
iteration-stats sample."""
from __future__ import annotations

from forge.config.models import (
    Artifact,
    Card,
    Contract,
    KvCache,
    Limits,
    ModelGeometry,
    Precision,
    Target,
)
from forge.engines.trtllm.section import SECTION, TrtllmSection

LLAMA7B = ModelGeometry(
    architecture="LlamaForCausalLM",
    num_layers=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=32000,
    weights_gib=7.2,
)

SWITCHES = TrtllmSection(prefix_aware_scheduling=True, overlap_scheduler=False, stream_interval=2)


def contract(
    *,
    artifact=None,
    kv=None,
    precision=("fp8", "fp8"),
    limits=(256, 8192, 1024, 128),
    target="12.0",
):
    artifact = artifact or Artifact(
        engine_dir="../engines/llama7b-fp8-1k", tokenizer="../engines/tok"
    )
    return Contract(
        contract="llama7b-fp8-1k",
        backend="trtllm",
        model=LLAMA7B,
        artifact=artifact,
        sections={SECTION: SWITCHES} if artifact.checkpoint is not None else {},
        precision=Precision(weights=precision[0], kv_cache=precision[1]),
        limits=Limits(
            max_batch_size=limits[0],
            max_num_tokens=limits[1],
            max_input_len=limits[2],
            max_output_len=limits[3],
        ),
        kv_cache=kv
        or KvCache(
            tokens_per_block=32, free_gpu_memory_fraction=0.85, host_cache_size=0, block_reuse=True
        ),
        target=Target(kind="gpu", compute_capability=target) if target else Target(kind="cpu"),
    )


CKPT = Artifact(checkpoint="../models/llama7b-fp8")


def gpu_card(index=0):
    return Card(
        index=index,
        kind="gpu",
        model="NVIDIA GeForce RTX 5090",
        memory_gib=32.0,
        compute_capability="12.0",
        engine="llama7b-fp8-1k",
    )


# The /metrics example of docs/source/commands/trtllm-serve (iter 154, its kvCacheStats), completed
# with the remaining keys IterationStats serializes to
# (cpp/tensorrt_llm/executor/jsonSerialization.cpp).
STATS_154 = {
    "timestamp": "12-03-2025 10:11:12",
    "iter": 154,
    "iterLatencyMS": 7.00688362121582,
    "newActiveRequestsQueueLatencyMS": 0.0007503032684326172,
    "numNewActiveRequests": 0,
    "numActiveRequests": 1,
    "numQueuedRequests": 3,
    "numCompletedRequests": 0,
    "maxNumActiveRequests": 2048,
    "maxBatchSizeStatic": 2048,
    "maxBatchSizeTunerRecommended": 0,
    "maxBatchSizeRuntime": 2048,
    "maxNumTokensStatic": 8192,
    "maxNumTokensTunerRecommended": 0,
    "maxNumTokensRuntime": 8192,
    "gpuMemUsage": 76665782272,
    "cpuMemUsage": 0,
    "pinnedMemUsage": 0,
    "kvCacheStats": {
        "allocNewBlocks": 3126,
        "allocTotalBlocks": 3126,
        "cacheHitRate": 0.00128,
        "freeNumBlocks": 101253,
        "maxNumBlocks": 101256,
        "missedBlocks": 3121,
        "reusedBlocks": 4,
        "tokensPerBlock": 32,
        "usedNumBlocks": 3,
    },
    "staticBatchingStats": None,
    "inflightBatchingStats": {
        "numScheduledRequests": 1,
        "numContextRequests": 0,
        "numGenRequests": 1,
        "numPausedRequests": 0,
        "numCtxTokens": 0,
        "microBatchId": 0,
        "avgNumDecodedTokensPerIter": 1.0,
    },
    "specDecodingStats": None,
}
