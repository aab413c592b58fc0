"""What a link has dispatched to its engine and not yet had answered, against the engine's credit:
its contract's slots and KV blocks times CREDIT_FACTOR, so the next batch already waits in the host
when a slot frees. A dispatch is (request id, attempt): an answer for another attempt of the same
request is not this dispatch's."""
from __future__ import annotations

from typing import Optional

from forge.broker import BrokerRequest, EngineGeometry, blocks_needed

# in flight + queued at an engine, relative to its contract's slots and KV blocks
CREDIT_FACTOR = 1.25


class Credit:
    def __init__(self, geometry: EngineGeometry, factor: float = CREDIT_FACTOR):
        self.geometry = geometry
        self._tok, self._tpb = geometry.tokenizer_key, geometry.tokens_per_block
        self.cap_slots = max(1, int(geometry.held * factor))     # slots and the engine's own queue
        self.cap_blocks = max(1, int(geometry.kv_blocks_total * factor))
        # rid -> (request, attempt, blocks)
        self.out: dict[str, tuple[BrokerRequest, int, int]] = {}
        self.used_slots = self.used_blocks = 0

    def free_slots(self) -> int:
        return self.cap_slots - self.used_slots

    def free_blocks(self) -> int:
        return self.cap_blocks - self.used_blocks

    def left(self) -> bool:
        return self.used_slots < self.cap_slots and self.used_blocks < self.cap_blocks

    def reserve(self, req: BrokerRequest) -> None:
        prompt = req.prompts.get(self._tok)
        # blocks_needed(req, geometry) inline (it runs per request); a request without this
        # tokenizer's prompt gets blocks_needed's own KeyError
        b = (blocks_needed(req, self.geometry) if prompt is None
             else -(-(len(prompt) + req.max_new_tokens) // self._tpb))
        self.out[req.request_id] = (req, req.attempt, b)
        self.used_slots += 1
        self.used_blocks += b

    def release(self, rid: str, attempt: int) -> Optional[BrokerRequest]:
        """The dispatch (rid, attempt) is answered: its request, or None if it is not one we wait on
        (a stale incarnation's answer, an orphan, a duplicate)."""
        entry = self.out.get(rid)
        if entry is None or entry[1] != attempt:
            return None
        del self.out[rid]
        self.used_slots -= 1
        self.used_blocks -= entry[2]
        return entry[0]

    def attempt_of(self, rid: str) -> Optional[int]:
        entry = self.out.get(rid)
        return entry[1] if entry is not None else None

    def clear(self) -> list[BrokerRequest]:
        """Everything dispatched, forgotten at once (the engine was lost)."""
        reqs = [r for r, _, _ in self.out.values()]
        self.out.clear()
        self.used_slots = self.used_blocks = 0
        return reqs
