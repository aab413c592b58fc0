"""BrokerCore: the pure, synchronous, engine-free broker (docs/broker.md).

Requests arrive tokenized for every tokenizer on the node; each engine pulls batches shaped to its
own contract (slots, KV blocks, token budget). Grouping by prefix and length, pinning prefix groups
to engines and balancing by measured speed live in batching.py and dispatch.py; this module keeps
the books: ids, what is in flight where, prefix-reuse and padding accounting, and the stats."""
from __future__ import annotations

from typing import Optional, Sequence

from forge import constants
from forge.broker.batching import Batcher
from forge.broker.dispatch import DEFAULT_SPEED_HALF_LIFE_S, DEFAULT_TAIL_SLACK, Balancer
from forge.broker.geometry import FitTable, LengthBuckets, grouping_view
from forge.broker.pending import HIT, NEW, ONE_ENGINE_CLASS_BITS, SPILL, Entry, Pending
from forge.prefix_blocks import BlockMirror, BoundedLRU, chain_hashes
from forge.broker.types import BrokerRequest, EngineGeometry, QueueFull
from forge.broker.warming import Warming
from forge.stats import BrokerStats

DEFAULT_PREFIX_DEPTH_BLOCKS = 1  # group key: chain hash of the first block(s) of the grouping view
DEFAULT_MAX_GROUP_VISITS = 32    # prefix groups one take may look at
MIN_PIN_CAPACITY = 1024          # prefix -> engine pins remembered, at least


class BrokerCore:
    def __init__(
        self,
        engines: Sequence[EngineGeometry],
        *,
        grouping: bool = True,
        max_pending: int = constants.BROKER_QUEUE_MAX_REQUESTS,
        affinity_load_factor: float = constants.AFFINITY_LOAD_FACTOR,
        node: str = "node",
        prefix_depth_blocks: int = DEFAULT_PREFIX_DEPTH_BLOCKS,
        length_buckets: Optional[Sequence[int]] = None,
        tail_slack: float = DEFAULT_TAIL_SLACK,
        max_group_visits: int = DEFAULT_MAX_GROUP_VISITS,
        pin_capacity: Optional[int] = None,
        speed_half_life_s: float = DEFAULT_SPEED_HALF_LIFE_S,
    ):
        engines = list(engines)
        if not engines:
            raise ValueError("a broker needs at least one engine")
        ids = [g.engine_id for g in engines]
        if len(set(ids)) != len(ids):
            raise ValueError(f"engine ids must be unique, got {ids}")
        if max_pending < 1 or prefix_depth_blocks < 1 or max_group_visits < 1:
            raise ValueError("max_pending, prefix_depth_blocks and max_group_visits must be >= 1")
        self.node, self.grouping, self.max_pending = node, grouping, max_pending
        self.engines = engines
        self._index = {eid: i for i, eid in enumerate(ids)}
        self._fit = FitTable(engines)
        self._buckets = LengthBuckets(max(g.max_input_len for g in engines), length_buckets)
        self._gtok, self._gunit = grouping_view(engines)
        self._depth = prefix_depth_blocks
        self._bal = Balancer(
            engines,
            affinity_load_factor=affinity_load_factor,
            tail_slack=tail_slack,
            half_life_s=speed_half_life_s,
        )
        pins = BoundedLRU(
            pin_capacity or max(MIN_PIN_CAPACITY, sum(g.kv_blocks_total for g in engines))
        )
        # fine output classes for one engine, whole powers of two for several (pending.py's
        # docstring says why)
        class_bits = ONE_ENGINE_CLASS_BITS if len(engines) == 1 else 0
        # output classes above prefix groups only where every engine asks for them
        # (Engine.output_classes_first)
        classes = grouping and all(g.output_classes_first for g in engines)
        self._pending = Pending(
            len(engines),
            len(self._buckets),
            self._bal,
            pins,
            class_levels=classes,
            class_bits=class_bits,
        )
        self._mirrors = [BlockMirror(g.kv_blocks_total) for g in engines]
        # a prefix new to an engine: its leader first (warming.py)
        self._warming = Warming(len(engines))
        self._batcher = Batcher(
            self._pending,
            self._bal,
            pins,
            self._buckets.lower,
            grouping,
            max_group_visits,
            # batching.py's docstring
            strict_classes=classes and len(engines) == 1,
            mirrors=self._mirrors,
            warming=self._warming if grouping else None,
        )
        self._entries: dict[str, Entry] = {}  # pending and in flight, by request id
        self._where: dict[str, int] = {}      # in flight: request id -> engine index
        self._seq = 0                         # arrival order; requeued work gets ever smaller seqs
        self._front = 0
        self._st = BrokerStats(node=node)

    # ------------------------------------------------------------------ arrivals
    def fitting_engines(self, req: BrokerRequest) -> list[str]:
        m = self._fit.mask(req)
        return [g.engine_id for i, g in enumerate(self.engines) if (m >> i) & 1]

    def has_room(self) -> bool:
        return self._pending.n < self.max_pending

    def check(self, req: BrokerRequest) -> None:
        """Raise NoEngineFits now if no engine's geometry admits the request (counts it as
        no_fit)."""
        if not self._fit.mask(req):
            self._st.no_fit += 1
            raise self._fit.refusal(req, self.node)

    def add(self, req: BrokerRequest) -> None:
        """Queue a request. Raises NoEngineFits (no engine can run it) or QueueFull (max_pending
        held)."""
        if self._pending.n >= self.max_pending:
            raise QueueFull(f"broker on node {self.node} holds {self._pending.n} requests "
                            "(max_pending)")
        rid = req.request_id
        if rid in self._entries:
            raise ValueError(f"request {rid} is already queued or in flight")
        e = self._entry(req)
        self._seq += 1
        e.seq = self._seq
        self._entries[rid] = e
        self._pending.push(e)
        self._bal.arrived()

    def _entry(self, req: BrokerRequest) -> Entry:
        mask = self._fit.mask(req)
        if not mask:
            self._st.no_fit += 1
            raise self._fit.refusal(req, self.node)
        prompt = req.prompts.get(self._gtok)
        keyed = prompt is not None
        if not keyed:
            prompt = next(iter(req.prompts.values()))
        n = len(prompt)
        bucket = self._buckets.index(n)
        key = None
        if self.grouping:
            unit = self._gunit
            if keyed and n >= unit:
                if self._depth == 1:
                    key = hash((unit, prompt[:unit]))          # == chain_hashes(prompt, unit, 1)[0]
                else:
                    key = chain_hashes(prompt, unit, self._depth)[-1]
            return Entry(req, 0, mask, n + req.max_new_tokens, key, bucket, bucket)
        return Entry(req, 0, mask, n + req.max_new_tokens, None, 0, bucket)

    # ------------------------------------------------------------------ dispatch
    def take(self, engine_id: str, *, free_slots: int, free_kv_blocks: int) -> list[BrokerRequest]:
        """One batch for this engine (see docs/broker.md); [] when nothing may go to it now."""
        i = self._engine(engine_id)
        if (
            free_slots <= 0
            or free_kv_blocks <= 0
            or not self._pending.n
            or not self._bal.healthy[i]
        ):
            return []
        geom = self.engines[i]
        entries = self._batcher.form(i, geom, free_slots, free_kv_blocks)
        if not entries:
            return []
        self._account(i, geom, entries)
        return [e.req for e in entries]

    def _account(self, i: int, geom: EngineGeometry, entries: list[Entry]) -> None:
        tok, tpb = geom.tokenizer_key, geom.tokens_per_block
        view = (tok, tpb)
        mirror, where, st = self._mirrors[i], self._where, self._st
        total = longest = shared = 0
        for e in entries:
            prompt = e.req.prompts[tok]
            n = len(prompt)
            total += n
            if n > longest:
                longest = n
            views = e.views
            hashes = views.get(view) if views is not None else None
            if hashes is None:
                hashes = chain_hashes(prompt, tpb)
                if views is None:
                    e.views = views = {}
                views[view] = hashes
            shared += mirror.dispatch(hashes) * tpb
            if e.via == HIT:
                st.affinity_hits += 1
            elif e.via == SPILL:
                st.affinity_spills += 1
            where[e.req.request_id] = i
        st.dispatched += len(entries)
        st.prompt_tokens += total
        st.shared_prefix_tokens += shared
        st.batch_tokens += longest * len(entries)
        st.padded_tokens += longest * len(entries) - total

    # ------------------------------------------------------------------ returns
    def requeue(self, reqs: Sequence[BrokerRequest]) -> None:
        """Back to the FRONT (in the order given), attempt += 1. Always accepted, even when full or
        closed: requeued work was already admitted once and must not be lost."""
        fresh = {r.request_id: self._entry(r) for r in reqs if r.request_id not in self._entries}
        back: list[Entry] = []
        for req in reqs:
            rid = req.request_id
            self._warming.done(rid)
            i = self._where.pop(rid, None)
            if i is not None:
                e = self._entries[rid]
                self._bal.finished(i, e.work)
                e.req = req
            elif rid in fresh:
                e = self._entries[rid] = fresh.pop(rid)
            else:
                continue  # already pending (a duplicate requeue): nothing to do
            req.attempt += 1
            e.via = NEW
            back.append(e)
        start = self._front - len(back)
        for k, e in enumerate(back):
            e.seq = start + k
        self._front = start
        for e in reversed(back):
            self._pending.push(e, front=True)

    def on_done(self, engine_id: str, req: BrokerRequest) -> None:
        """The engine finished (or failed) the request for good; unknown or repeated calls are
        no-ops."""
        self._engine(engine_id)
        rid = req.request_id
        if self._warming:
            self._warming.done(rid)
        i = self._where.pop(rid, None)
        if i is not None:
            self._bal.finished(i, self._entries.pop(rid).work)

    def on_done_many(self, engine_id: str, reqs: Sequence[BrokerRequest]) -> None:
        """on_done for each of `reqs`, the engine looked up once."""
        self._engine(engine_id)            # an unknown engine is refused as in on_done
        where, entries, finished = self._where, self._entries, self._bal.finished
        warm = self._warming.done if self._warming else None
        for req in reqs:
            rid = req.request_id
            if warm is not None:
                warm(rid)
            i = where.pop(rid, None)
            if i is not None:
                finished(i, entries.pop(rid).work)

    def record_delivery(
        self, engine_id: str, tokens: int, elapsed_s: float, occupancy: float = 1.0
    ) -> None:
        """Tokens (input + output) the engine delivered over the last `elapsed_s` seconds of work,
        with `occupancy` (0..1): the mean share of its slots or KV blocks (whichever was fuller) in
        use over them, 1.0 when the caller does not know. The broker weighs the engine by tokens /
        (elapsed_s x occupancy)."""
        self._bal.record(self._engine(engine_id), tokens, elapsed_s, occupancy)

    def set_engine_healthy(self, engine_id: str, healthy: bool) -> None:
        i = self._engine(engine_id)
        if self._bal.healthy[i] == healthy:
            return
        self._bal.set_healthy(i, healthy)
        if not healthy:
            self._pending.release(i)
            self._warming.release(i)

    def drain(self) -> list[BrokerRequest]:
        """Remove and return everything pending (priority, then arrival order), e.g. to fail it on
        stop."""
        out = self._pending.drain()
        for e in out:
            del self._entries[e.req.request_id]
        return [e.req for e in out]

    # ------------------------------------------------------------------ observation
    def pending(self) -> int:
        return self._pending.n

    def in_flight(self) -> int:
        return len(self._where)

    def loads(self) -> dict[str, dict]:
        """Per engine: measured tokens/s, balancing weight, health, outstanding and pinned work."""
        return self._bal.snapshot()

    def stats(self) -> BrokerStats:
        s = self._st
        labels = self._buckets.labels
        by_bucket = {labels[b]: c for b, c in enumerate(self._pending.bucket_counts) if c}
        return BrokerStats(
            node=self.node,
            pending=self._pending.n,
            pending_by_bucket=by_bucket,
            dispatched=s.dispatched,
            affinity_hits=s.affinity_hits,
            affinity_spills=s.affinity_spills,
            prompt_tokens=s.prompt_tokens,
            shared_prefix_tokens=s.shared_prefix_tokens,
            padded_tokens=s.padded_tokens,
            batch_tokens=s.batch_tokens,
            no_fit=s.no_fit,
        )

    def _engine(self, engine_id: str) -> int:
        try:
            return self._index[engine_id]
        except KeyError:
            raise ValueError(f"unknown engine {engine_id!r} on node {self.node} "
                             f"(engines: {', '.join(self._index)})") from None
