"""Per-request sampling seeds on vLLM's CPU platform, drawn by forge instead of vLLM's per-request
generator.

Why (issue 49). vLLM gives a seeded request a `torch.Generator` of its own. When a step schedules
only part of a request's prompt (chunked prefill, or a prefix hit that leaves a partial block), the
runner samples that row anyway, discards the token, and winds the generator back:
`gen.set_offset(gen.get_offset() - 4)` in `GPUModelRunner._bookkeeping_sync`
(vllm/v1/worker/gpu_model_runner.py, 0.32), written for CUDA's Philox generator. The CPU generator
(mt19937) has no offset: `RuntimeError: CPU Generator does not use offset`, raised from the step, so
the engine dies for every request on the card. 48 seeded requests at once are enough to chunk one
prompt.

What forge does instead. On a cpu target a sampled request with a seed reaches vLLM without one, as
a greedy request (temperature 0) carrying its sampling in `SamplingParams.extra_args[EXTRA_KEY]`.
This logits processor (vLLM's per-request `AdapterLogitsProcessor`, registered after the choice
guide so it draws among the guide's tokens) applies the request's temperature, top-k and top-p,
draws one token with a generator seeded from (seed, position of the token), and leaves only that
token possible; vLLM's greedy pick takes it. vLLM keeps no generator for the request, so there is
nothing to wind back. Seeding by position rather than advancing one generator makes a discarded draw
harmless: the row sampled while a prompt is still being filled is drawn again, identically, when the
prompt ends. The same seed gives the same text whatever the chunking, the batch or a preemption (up
to the last bits of the logits, as on transformers: forge/engines/transformers/seeded.py). Requests
without the key cost the processor nothing.
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional

from forge.engines.interface import Sampling

# extra_args: {"forge_seed": {"seed": int, "temperature": float, "top_p": .., "top_k": ..}}
EXTRA_KEY = "forge_seed"


def wanted(s: Sampling) -> bool:
    """Whether a request's tokens depend on its seed: a sampled request (temperature > 0, top_k not
    1) with one."""
    return s.seed is not None and s.temperature > 0 and s.top_k != 1


def extra_args(s: Sampling) -> dict[str, Any]:
    """What a seeded request carries for the processor (plain values: vLLM checks extra_args)."""
    return {
        EXTRA_KEY: {
            "seed": int(s.seed),
            "temperature": float(s.temperature),
            "top_p": float(s.top_p),
            "top_k": int(s.top_k),
        }
    }


def draw_seed(seed: int, position: int) -> int:
    """The generator seed of a request's token at `position`: a hash, so no two (seed, position)
    pairs share one."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def shaped_logits(logits, temperature: float, top_k: int, top_p: float):
    """float32 logits scaled by the temperature, with the tokens top-k and top-p leave out at -inf
    (in that order, as vLLM and transformers apply them). The most likely token always stays."""
    import torch

    scores = logits.float() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, index = torch.sort(scores, descending=True)
        before = torch.softmax(ordered, dim=-1).cumsum(-1) - torch.softmax(ordered, dim=-1)
        drop = before >= top_p  # tokens whose predecessors already hold top_p of the mass
        scores = scores.clone()
        scores[index[drop]] = float("-inf")
    return scores


def draw(logits, spec: dict, position: int) -> int:
    """The token a seeded request takes at `position` from this row of logits."""
    import torch

    scores = shaped_logits(logits, spec["temperature"], spec["top_k"], spec["top_p"])
    generator = torch.Generator(device=logits.device)
    generator.manual_seed(draw_seed(spec["seed"], position))
    return int(torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator))


def processor_class() -> Optional[type]:
    """The vLLM logits processor class (vLLM imported only in the card worker); None where the
    installed vLLM has no per-request adapter (0.34 and later)."""
    import torch

    try:
        from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
    except ImportError:
        return None

    class ForgeSeededSampler(AdapterLogitsProcessor):
        def is_argmax_invariant(self) -> bool:
            return False  # it picks the token: it must run for the greedy request it rides on

        def new_req_logits_processor(self, params):
            spec = (params.extra_args or {}).get(EXTRA_KEY)
            if spec is None:
                return None

            def only_the_drawn_token(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                token = draw(logits, spec, len(output_ids))
                only = torch.full_like(logits, float("-inf"))
                only[token] = 0.0
                return only

            return only_the_drawn_token

    return ForgeSeededSampler
