"""The one interface of a node, whatever it is: what a job (forge/functions/job.py), `forge serve` and the
control endpoint ask of it. Three kinds implement it:

    LocalNode    (local.py)    the node in this process: broker + one link per card (worker processes)
    RemoteNode   (remote.py)   a node provisioned elsewhere (`forge provision`), over HTTP
    ClusterNode  (forge/cluster/client.py)  every engine provisioned on a Ray cluster

Every request gets one typed answer: an Answer (the Generation, and the hidden state for embed requests),
or an exception - RequestRejected (the caller's to fix: a refusal, no engine fits, a closed node), NodeDown
(no engine can work; a job stops without error rows), ForgeError (the engine failed the request)."""
from __future__ import annotations

import abc
from typing import NamedTuple, Optional, Sequence

from forge.errors import ForgeError
from forge.requests import GenerateParams, Generation
from forge.stats import BrokerStats, EngineStats


class Answer(NamedTuple):
    generation: Generation
    hidden: Optional[list[float]] = None      # the final hidden state, for embed requests


class Node(abc.ABC):
    name: str = "?"
    closed: bool = False
    abandoned: int = 0                        # requests whose caller stopped waiting (cancelled)

    @abc.abstractmethod
    async def start(self) -> None:
        """Bring the node up (or reach it); raise ForgeError with one line if it cannot be."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop at once: what is still waiting fails; everything the node started is ended."""

    async def drain(self, timeout_s: float) -> bool:
        """Take nothing new and let what is in flight finish (bounded). True when nothing was cut short."""
        self.closed = True
        return True

    @abc.abstractmethod
    async def submit(self, prompt: str | Sequence[int], params: GenerateParams, *, wait: bool = True) -> Answer:
        """One request. wait=False: a full queue is refused at once (QueueFull) instead of waited out."""

    async def generate(self, prompt: str | Sequence[int], params: GenerateParams) -> Generation:
        return (await self.submit(prompt, params)).generation

    async def embed(self, prompt: str | Sequence[int]) -> list[float]:
        return (await self.embed_counted(prompt))[0]

    async def embed_counted(self, prompt: str | Sequence[int]) -> tuple[list[float], int]:
        """The embedding and the prompt tokens the engine read for it (a job counts them as tokens in)."""
        answer = await self.submit(prompt, GenerateParams(max_tokens=1, embed=True))
        if answer.hidden is None:
            raise ForgeError(f"card {answer.generation.card}: its backend returns no hidden state")
        return list(answer.hidden), answer.generation.input_tokens

    # ------------------------------------------------------------------ observation
    # read_engine_stats() shows an engine's newest counters within this many seconds of its last step.
    engine_stats_lag_s: float = 1.0

    def engine_stats(self) -> list[EngineStats]:
        return []

    async def read_engine_stats(self) -> list[EngineStats]:
        """engine_stats(), read from the engines now where the node can ask them, else as last reported."""
        return self.engine_stats()

    def broker_stats(self) -> Optional[BrokerStats]:
        return None

    def describe(self) -> dict:
        return {"node": self.name, "cards": []}

    def healthy_cards(self) -> list[str]:
        return []

    def open_requests(self) -> int:
        return 0
