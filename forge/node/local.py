"""The node on this machine: one engine host per card, each in its own worker process (or, with
card_transport="thread", on this process's loop), all fed by one broker through one link each.
`forge run` embeds it; `forge provision` serves it over HTTP (provision.py, endpoint.py).

The node process keeps the functions, the broker, the ledger, metrics and HTTP; it never imports an
engine library. Prompts are tokenized here, with each engine's tokenizer copied from its worker
(forge/host/ tokenizer.py) once the copy encodes the worker's probe texts exactly as the engine
does; otherwise through the worker (forge/link/encoder.py)."""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any, Literal, Optional, Sequence

from forge import constants
from forge.config.load import LoadedDescription
from forge.config.plan import engine_plans
from forge.errors import ForgeError, engine_failed_to_start
from forge.link.transport import Transport
from forge.node.linked import LinkedNode
from forge.requests.prompt_bounds import OFF_LOOP_CHARS, prompt_chars_limit

log = logging.getLogger("forge.node")

CardTransport = Literal["process", "thread"]
CARD_TRANSPORTS = ("process", "thread")
CARD_STATE = {"down": "restarting", "gone": "failed"}   # a card's state, when its link is not up
NODE_DOWN_GRACE_S = 1.0      # every card failed or unhealthy this long = the node is down
SWEEP_INTERVAL_S = 0.25


class LocalNode(LinkedNode):
    restarting_counts = False  # a worker being started again is bounded by its own restart limit

    def __init__(
        self,
        loaded: LoadedDescription,
        *,
        grouping: bool = True,
        stall_window_s: float = constants.STALL_WINDOW_S,
        card_transport: CardTransport = "process",
        worker_cpus: Optional[frozenset[int]] = None,
    ):
        """card_transport: "process" (each card's engine host in its own worker process) or "thread"
        (in this process, on its event loop; the cheap path for tests and the "before" of
        benchmarks). worker_cpus: CPU cores the worker processes run on (default: wherever this
        process may run)."""
        if card_transport not in CARD_TRANSPORTS:
            raise ForgeError(f"card_transport must be one of {', '.join(CARD_TRANSPORTS)}, not "
                             f"{card_transport!r}")
        super().__init__(loaded.node.node, grouping=grouping, down_grace_s=NODE_DOWN_GRACE_S,
                         sweep_interval_s=SWEEP_INTERVAL_S)
        self.loaded = loaded
        # one per engine: a card with replicas: N runs N workers
        self.plans = engine_plans(loaded.plans)
        self.stall_window_s = stall_window_s
        self.card_transport = card_transport
        self.worker_cpus = worker_cpus
        self.transports: list[Any] = []

    # ------------------------------------------------------------------ lifecycle
    def launch(self) -> None:
        """Start every card's worker now; they load their engines at the same time, while the caller
        goes on with its own setup. start() waits for them. Idempotent."""
        if self.transports:
            return
        from forge.backends import factory

        for p in self.plans:        # refuse an unknown backend before starting anything
            factory(p.contract.backend, card=p.card_id)
        self.transports = [self._transport(p) for p in self.plans]
        for t in self.transports:
            t.launch()

    def _transport(self, plan) -> Transport:
        if self.card_transport == "thread":
            from forge.link.thread import ThreadTransport

            return ThreadTransport(plan, node=self.name, stall_window_s=self.stall_window_s)
        from forge.link.process import ProcessTransport

        # the card's own cores first
        cpus = frozenset(plan.card.cores) if plan.card.cores else self.worker_cpus
        return ProcessTransport(plan, node=self.name, stall_window_s=self.stall_window_s, cpus=cpus)

    async def start(self) -> None:
        """Every card's engine loaded (concurrently, each in its worker) with exactly its contract;
        then the links."""
        t0 = time.monotonic()
        self.launch()
        hellos = await asyncio.gather(*(t.start() for t in self.transports), return_exceptions=True)
        failed = [(p, e) for p, e in zip(self.plans, hellos) if isinstance(e, BaseException)]
        if failed:
            await self._release()
            p, e = failed[0]
            if isinstance(e, ForgeError):
                raise e
            raise engine_failed_to_start(p.engine_id, p.contract.contract, e) from e
        self.attach_links(list(zip(self.transports, hellos)))
        await self._adopt_tokenizers()
        log.info(
            "node %s: %d engine(s) up in %.1f s (%s)",
            self.name,
            len(self.links),
            time.monotonic() - t0,
            self.card_transport,
        )

    async def _adopt_tokenizers(self) -> None:
        """One copy per tokenizer key, asked of one of its hosts and checked against that host's own
        encoding."""
        remote = []
        for key in self.tokenizer_keys():
            lk = next(lk for lk in self.links.values() if lk.key == key)
            try:
                tok, probes = await lk.transport.tokenizer_copy(timeout_s=60.0)
                bad = [text for text, ids in probes if list(tok.encode(text)) != list(ids)]
            except Exception as e:  # noqa: BLE001 - a copy that cannot be had: tokenize through the host
                tok, bad = None, [f"{type(e).__name__}: {e}"]
            if bad:
                print(
                    f"forge: card {lk.eid}: this process's copy of its tokenizer does not encode "
                    "as the engine "
                    f"does ({bad[0]!r}); prompts are tokenized by the card's worker",
                    file=sys.stderr,
                    flush=True,
                )
                remote.append(key)
            else:
                self.tokenizers[key] = tok
        self._use_encoders(remote)
        self.prompt_chars_limit = prompt_chars_limit(
            (lk.geometry.max_input_len, self.tokenizers.get(lk.key)) for lk in self.links.values()
        )

    async def _release(self) -> None:
        await asyncio.gather(
            *(t.close(constants.ENGINE_SHUTDOWN_TIMEOUT_S) for t in self.transports),
            return_exceptions=True,
        )

    # ------------------------------------------------------------------ requests
    def encode_now(self, prompt: str | Sequence[int]) -> Optional[dict[str, tuple[int, ...]]]:
        if not isinstance(prompt, str):
            return super().encode_now(prompt)
        if self.encoders or len(prompt) > OFF_LOOP_CHARS:
            return None
        return {k: tuple(t.encode(prompt)) for k, t in self.tokenizers.items()}

    async def encode(self, prompt: str | Sequence[int]) -> dict[str, tuple[int, ...]]:
        if isinstance(prompt, str) and not self.encoders and len(prompt) > OFF_LOOP_CHARS:
            # the Rust tokenizer lets go of the GIL
            return await asyncio.to_thread(self._encode_locally, prompt)
        return await super().encode(prompt)

    def _encode_locally(self, prompt: str) -> dict[str, tuple[int, ...]]:
        return {k: tuple(t.encode(prompt)) for k, t in self.tokenizers.items()}

    # ------------------------------------------------------------------ observation
    def describe(self) -> dict:
        cards = []
        for lk in self.links.values():
            st, info = lk.stats(), lk.info
            cards.append(
                {
                    "card": lk.eid,
                    "replica": info.replica,
                    "model": info.model,
                    "tier": info.tier,
                    "backend": info.backend,
                    "healthy": bool(st and st.healthy),
                    "limits": info.limits,
                    "kv_blocks": info.kv_blocks,
                    "full_length_slots": info.full_length_slots,
                    "state": CARD_STATE.get(lk.state, lk.engine_state),
                    "failure": lk.failure,
                    "in_flight": st.in_flight if st else 0,
                    "kv_blocks_reserved": st.kv_blocks_reserved if st else 0,
                    "guides": list(info.guides),
                    "tokens_per_s": round(st.tokens_per_s, 1) if st else 0.0,
                    "output_tokens_per_s": round(st.output_tokens_per_s, 1) if st else 0.0,
                    "pid": info.pid,
                    "transport": self.card_transport,
                }
            )
        return {
            "node": self.name,
            "started_at": self.started_at,
            "cards": cards,
            "pending": self.broker.pending() if self.broker else 0,
            "closed": self.closed,
            "open_requests": self.open_requests(),
            "abandoned": self.abandoned,
            "down": self.down,
        }
