"""The one interface of a node, whatever it is: what a job (forge/functions/job.py), `forge serve`
and the control endpoint ask of it. Three kinds implement it:

    LocalNode    (local.py)    the node in this process: broker + one link per card (worker processes)
    RemoteNode   (remote.py)   a node provisioned elsewhere (`forge provision`), over HTTP
    ClusterNode  (forge/cluster/client.py)  every engine provisioned on a Ray cluster

Every request gets one typed answer: an Answer (the Generation, and the hidden state for embed
requests), or an exception - RequestRejected (the caller's to fix: a refusal, no engine fits, a
closed node), NodeDown (no engine can work; a job stops without error rows), ForgeError (the engine
failed the request).

`submit` owns the whole request, whatever edge it came in by (a function's llm handle, the control
endpoint, forge serve): the prompt's check (once), a chat's template, the guide's feasibility on the
node's cards and the check of guided output, and the stop strings of its GenerateParams. The rules
are forge/requests/'s; a node that is elsewhere (RemoteNode) forwards the prompt or messages and the
GenerateParams whole, and its node applies them."""
from __future__ import annotations

import abc
from typing import AsyncIterator, NamedTuple, Optional, Protocol, Sequence, Union

from forge.errors import ForgeError
from forge.requests import GenerateParams, Generation
from forge.requests.messages import Chat
from forge.stats import BrokerStats, EngineStats

# text, token ids, or chat messages for the model's template
Prompt = Union[str, Sequence[int], Chat]


class Answer(NamedTuple):
    generation: Generation
    hidden: Optional[list[float]] = None      # the final hidden state, for embed requests
    stop_reason: Optional[str] = None         # the stop string that cut the text, if one did


class TextTokenizer(Protocol):
    """What callers above the node may do with a card's tokenizer (forge serve's echo and
    streaming)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Node(abc.ABC):
    name: str = "?"
    closed: bool = False
    abandoned: int = 0                        # requests whose caller stopped waiting (cancelled)
    started_at: float = 0.0
    prompt_chars_limit: int = 0               # longer text prompts fit no card (0: not known here)
    # where the node is, when it is not in this process (RemoteNode)
    remote_url: Optional[str] = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Bring the node up (or reach it); raise ForgeError with one line if it cannot be."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop at once: what is still waiting fails; everything the node started is ended."""

    async def drain(self, timeout_s: float) -> bool:
        """Take nothing new and let what is in flight finish (bounded). True when nothing was cut
        short."""
        self.closed = True
        return True

    @abc.abstractmethod
    async def submit(self, prompt: Prompt, params: GenerateParams, *, wait: bool = True) -> Answer:
        """One request, whole (see the module's docstring). wait=False: a full queue is refused at
        once (QueueFull) instead of waited out."""

    async def stream(self, prompt: Prompt, params: GenerateParams, *,
                     wait: bool = True) -> AsyncIterator[Union[str, Answer]]:
        """submit() with the answer's text sent as it grows: text pieces, then the Answer (whose
        text they join into). A node that cannot stream sends the whole text as one piece
        (forge/node/streamed.py streams)."""
        answer = await self.submit(prompt, params, wait=wait)
        if answer.generation.text:
            yield answer.generation.text
        yield answer

    async def generate(self, prompt: Prompt, params: GenerateParams) -> Generation:
        return (await self.submit(prompt, params)).generation

    async def embed(self, prompt: str | Sequence[int]) -> list[float]:
        answer = await self.submit(prompt, GenerateParams(max_tokens=1, embed=True))
        if answer.hidden is None:
            raise ForgeError(f"card {answer.generation.card}: its backend returns no hidden state")
        return list(answer.hidden)

    # ------------------------------------------------------------------ observation
    # read_engine_stats() shows an engine's newest counters within this many seconds of its last
    # step.
    engine_stats_lag_s: float = 1.0

    def engine_stats(self) -> list[EngineStats]:
        return []

    async def read_engine_stats(self) -> list[EngineStats]:
        """engine_stats(), read from the engines now where the node can ask them, else as last
        reported."""
        return self.engine_stats()

    def broker_stats(self) -> Optional[BrokerStats]:
        return None

    async def refresh_stats(self) -> None:
        """Read the stats again now where they come from elsewhere (a job's final figures include
        its last results)."""

    def tokenizer_for(self, card: Optional[str] = None) -> Optional[TextTokenizer]:
        """The tokenizer of `card` (any card's for None) where this process has a copy; None where
        it has not."""
        return None

    def describe(self) -> dict:
        return {"node": self.name, "cards": []}

    def healthy_cards(self) -> list[str]:
        return []

    def open_requests(self) -> int:
        return 0
