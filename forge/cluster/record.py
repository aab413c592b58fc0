"""A provisioned node's record on the cluster: a small actor the agent owns (it dies with the
agent), named `node:<name>`, that `forge status --cluster` reads. The agent refreshes it every
heartbeat."""
from __future__ import annotations

import time


class NodeRecord:
    def __init__(self, info: dict):
        self.info = dict(info)
        self.cards: list[dict] = []
        self.state = "starting"
        self.beat = time.time()

    async def update(self, state: str, cards: list[dict]) -> None:
        self.state, self.cards, self.beat = state, list(cards), time.time()

    async def describe(self) -> dict:
        return {**self.info, "state": self.state, "cards": self.cards,
                "heartbeat_age_s": round(time.time() - self.beat, 1)}
