"""Per-request sampling seeds for the transformers engine.

transformers' continuous batching samples every row with one engine-wide random generator, so a
request's seed cannot be handed to it. This processor runs last in the manager's processor list,
after temperature, top-k and top-p have shaped the scores: for each seeded row it draws the next
token from those scores with the request's own generator (seeded once, advanced one draw per token)
and leaves only that token possible. The manager's own draw then has one choice. The distribution is
the one the manager would have sampled from; only the randomness is the request's. Unseeded rows are
untouched.

A seeded request gives the same tokens when its scores are the same. Batch composition can change
the last bits of the scores (other requests in the same step change the kernels' shapes), so, as in
vLLM, a seed makes a request reproducible in practice, not bit for bit under every load. Like the
guide processor it runs Python each step, so it needs the eager loop (no CUDA graphs, no compile, no
async batching)."""
from __future__ import annotations

import threading
from typing import Optional

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)


class SeededSampler(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self):
        self._lock = threading.Lock()
        self._seeds: dict[str, int] = {}                   # manager id -> seed
        self._generators: dict[str, torch.Generator] = {}  # made on the scores' device at first use
        self._rows: list[tuple[int, str]] = []

    def add(self, request_id: str, seed: int) -> None:
        with self._lock:
            self._seeds[request_id] = seed

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._seeds.pop(request_id, None)
            self._generators.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._seeds)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        rows = []
        if self._seeds:
            with self._lock:
                rows = [(i, fr.state.request_id) for i, fr in enumerate(requests_with_new_token)
                        if fr.state.request_id in self._seeds]
        self._rows = rows
        return torch.full((len(requests_with_new_token),), -1, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows, self._rows = self._rows, []
        for i, rid in rows:
            if i >= scores.size(0):
                continue
            gen = self._generator(rid, scores.device)
            if gen is None:
                continue
            probs = torch.softmax(scores[i].float(), dim=-1)
            token = torch.multinomial(probs, 1, generator=gen)
            only = torch.full_like(scores[i], float("-inf"))
            only[token] = 0.0
            scores[i] = only
        return scores

    def _generator(self, rid: str, device: torch.device) -> Optional[torch.Generator]:
        with self._lock:
            gen = self._generators.get(rid)
            if gen is None and rid in self._seeds:
                gen = torch.Generator(device=device)
                gen.manual_seed(self._seeds[rid] % 2**64)
                self._generators[rid] = gen
            return gen


def install(manager) -> SeededSampler:
    """Put a SeededSampler last in the manager's processors (after temperature, top-k, top-p). Must
    run before the batch processor is built (warmup/start), which sizes its argument buffers from
    `tensors_required`."""
    lp = manager.logit_processor
    sampler = SeededSampler()
    lp.logits_processor.append(sampler)
    lp.tensors_required += 1
    lp.do_processing = True
    return sampler
