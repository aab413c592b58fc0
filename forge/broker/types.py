"""Plain objects the broker trades in: requests, one engine's geometry, and the broker's errors."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from forge.errors import RequestRejected


@dataclass(eq=False)
class BrokerRequest:
    """One generation request. Identity (not value) equality: the same object travels out and
    back."""

    request_id: str                               # unique; idempotent across requeues
    prompts: Mapping[str, tuple[int, ...]]        # tokenizer_key -> prompt token ids
    max_new_tokens: int
    payload: Any = None  # opaque to the broker and the runtime
    priority: int = 0    # 0 = bulk; higher is served first (online requests)
    attempt: int = 0     # incremented by requeue()
    enqueued_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"request {self.request_id}: max_new_tokens must be >= 0, got "
                             f"{self.max_new_tokens}")
        # Prefix hashing slices prompts and hashes the slices, which needs tuples; convert once
        # here.
        for v in self.prompts.values():  # a loop, not any(<generator>): this runs for every request
            if type(v) is not tuple:
                self.prompts = {k: tuple(v) for k, v in self.prompts.items()}
                break

    def prompt_for(self, tokenizer_key: str) -> tuple[int, ...]:
        try:
            return self.prompts[tokenizer_key]
        except KeyError:
            raise KeyError(f"request {self.request_id} has no prompt for tokenizer "
                           f"{tokenizer_key!r} "
                           f"(it has {sorted(self.prompts)})") from None


@dataclass(frozen=True)
class EngineGeometry:
    """What one engine can hold, read from its contract and plan — never a constant."""

    engine_id: str                                # e.g. "cpu0", "gpu1"
    tokenizer_key: str
    max_batch_size: int  # contract limits.max_batch_size (slots)
    max_num_tokens: int  # contract limits.max_num_tokens (THE token budget per step)
    max_input_len: int
    max_output_len: int
    tokens_per_block: int                         # contract kv_cache.tokens_per_block
    kv_blocks_total: int                          # CardPlan.num_blocks
    # the engine's Engine.shares_prefix_within_step; False: a prefix group new to it sends its
    # leader alone first
    shares_prefix_within_step: bool = True
    # the engine's Engine.output_classes_first; False: bulk work by prefix group, not longest output
    # first
    output_classes_first: bool = True
    # requests the engine holds waiting beyond its slots (Engine.queues_beyond_slots:
    # max_batch_size, else 0)
    queue_slots: int = 0

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_num_tokens", "max_input_len", "max_output_len",
                     "tokens_per_block", "kv_blocks_total"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ValueError(f"engine {self.engine_id}: {name} must be a positive int, got "
                                 f"{v!r}")
        if type(self.queue_slots) is not int or self.queue_slots < 0:
            raise ValueError(f"engine {self.engine_id}: queue_slots must be an int >= 0, got "
                             f"{self.queue_slots!r}")

    @property
    def held(self) -> int:
        """Requests the engine may hold at once: its slots and its own waiting queue."""
        return self.max_batch_size + self.queue_slots

    def limits_text(self) -> str:
        return (f"{self.engine_id} (max_input_len {self.max_input_len}, max_output_len "
                f"{self.max_output_len}, "
                f"{self.kv_blocks_total} KV blocks of {self.tokens_per_block} tokens)")


def blocks_for(prompt_tokens: int, max_new_tokens: int, tokens_per_block: int) -> int:
    """KV blocks a request reserves: ceil((prompt + max_new_tokens) / tokens_per_block). The one
    formula the node's broker, the links' credit, an engine host's queue and its admission all count
    with."""
    return -(-(prompt_tokens + max_new_tokens) // tokens_per_block)


def blocks_needed(req: BrokerRequest, geom: EngineGeometry) -> int:
    """KV blocks the request reserves on that engine (blocks_for with its prompt in the engine's
    tokenizer)."""
    return blocks_for(
        len(req.prompt_for(geom.tokenizer_key)), req.max_new_tokens, geom.tokens_per_block
    )


class NoEngineFits(RequestRejected):
    """No engine on the node can take the request as asked; the message names lengths and every
    limit."""


class BrokerClosed(RequestRejected):
    """The broker is closed: no new work is accepted, and nothing is left to take."""


class QueueFull(asyncio.QueueFull):
    """The broker holds max_pending requests (the online path answers 429)."""
