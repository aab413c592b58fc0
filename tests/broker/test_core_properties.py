"""Property tests (hypothesis): random engines, random operation sequences, checked against a plain
model.

Invariants on every take: no batch exceeds the slots, KV blocks or token budget it was offered (a
single prompt over the budget goes alone); requests only reach engines whose geometry fits them; a
batch is one priority, the highest this engine may serve; FIFO mode hands out exactly the oldest
(requeued first) requests. Over a run: every added request is taken exactly once per attempt,
nothing is stuck once every engine is healthy and idle, and the broker's books (pending, in flight,
work counters) match the model."""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from forge.broker import BrokerCore, BrokerRequest, EngineGeometry, NoEngineFits, QueueFull

from .helpers import blocks, fits

STEMS = [tuple(range(100 * s, 100 * s + 40)) for s in range(4)]     # shared prefixes


@st.composite
def geometries(draw):
    n = draw(st.integers(1, 3))
    out = []
    for k in range(n):
        out.append(
            EngineGeometry(
                engine_id=f"e{k}",
                tokenizer_key=draw(st.sampled_from(["a", "b"])),
                max_batch_size=draw(st.integers(1, 6)),
                max_num_tokens=draw(st.integers(8, 96)),
                max_input_len=draw(st.integers(8, 80)),
                max_output_len=draw(st.integers(4, 24)),
                tokens_per_block=draw(st.sampled_from([2, 4, 8, 16])),
                kv_blocks_total=draw(st.integers(4, 60)),
            )
        )
    return out


@st.composite
def requests(draw):
    stem = draw(st.sampled_from(STEMS))
    cut = draw(st.integers(0, len(stem)))
    tail = tuple(draw(st.lists(st.integers(1000, 1010), max_size=24)))
    a = stem[:cut] + tail
    b = tuple(t + 1 for t in a[: draw(st.integers(0, len(a)))])  # another tokenizer, other length
    return dict(prompts={"a": a, "b": b}, max_new_tokens=draw(st.integers(0, 16)),
                priority=draw(st.integers(0, 2)))


class BrokerMachine(RuleBasedStateMachine):
    @initialize(engines=geometries(), grouping=st.booleans(), max_pending=st.integers(1, 40),
                factor=st.sampled_from([1.0, 1.25, 2.0]))
    def setup(self, engines, grouping, max_pending, factor):
        self.engines = {g.engine_id: g for g in engines}
        self.grouping = grouping
        self.core = BrokerCore(
            engines,
            grouping=grouping,
            max_pending=max_pending,
            affinity_load_factor=factor,
            max_group_visits=4,
        )
        self.order: list[BrokerRequest] = []  # pending, in FIFO order (requeued at the front)
        self.flight: dict[str, tuple[BrokerRequest, str]] = {}
        self.takes: dict[str, int] = {}
        self.all: dict[str, BrokerRequest] = {}
        self.healthy = {e: True for e in self.engines}
        self.n = 0

    # ------------------------------------------------------------------ operations
    @rule(spec=requests())
    def add(self, spec):
        self._add(spec)

    @rule(specs=st.lists(requests(), min_size=2, max_size=8))
    def add_many(self, specs):
        for spec in specs:
            self._add(spec)

    def _add(self, spec):
        self.n += 1
        r = BrokerRequest(request_id=f"r{self.n}", **spec)
        fitting = [e for e, g in self.engines.items() if fits(r, g)]
        assert self.core.fitting_engines(r) == fitting
        full = not self.core.has_room()
        try:
            self.core.add(r)
        except QueueFull:
            assert full
            return
        except NoEngineFits as e:
            assert not fitting
            msg = str(e)
            assert r.request_id in msg and f"max_new_tokens {r.max_new_tokens}" in msg
            assert all(f"max_input_len {g.max_input_len}" in msg for g in self.engines.values())
            return
        assert fitting and not full
        self.order.append(r)
        self.all[r.request_id] = r

    @rule(
        engine=st.sampled_from(["e0", "e1", "e2"]), slots=st.integers(0, 7), kv=st.integers(0, 50)
    )
    def take(self, engine, slots, kv):
        if engine not in self.engines:
            return
        g = self.engines[engine]
        pending_before = list(self.order)
        batch = self.core.take(engine, free_slots=slots, free_kv_blocks=kv)
        if not batch:
            return
        assert self.healthy[engine]
        assert len(batch) <= slots
        assert sum(blocks(r, g) for r in batch) <= kv
        prompt_tokens = sum(len(r.prompts[g.tokenizer_key]) for r in batch)
        assert len(batch) == 1 or prompt_tokens <= g.max_num_tokens
        assert all(fits(r, g) for r in batch)
        ids = [r.request_id for r in batch]
        assert len(set(ids)) == len(ids)
        assert all(i not in self.flight for i in ids), "taken twice"
        prios = {r.priority for r in batch}
        assert len(prios) == 1
        mine = [r for r in pending_before if fits(r, g)]
        top = max(r.priority for r in mine)
        if not self.grouping or len(self.engines) == 1:
            assert prios == {top}, "a lower priority went first"
        if not self.grouping:
            assert batch == [r for r in mine if r.priority == top][: len(batch)], (
                "FIFO order broken"
            )
        for r in batch:
            self.order.remove(r)
            self.flight[r.request_id] = (r, engine)
            self.takes[r.request_id] = self.takes.get(r.request_id, 0) + 1

    @precondition(lambda self: self.flight)
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(sorted(self.flight)))
        r, engine = self.flight.pop(rid)
        self.core.on_done(engine, r)

    @precondition(lambda self: self.flight)
    @rule(data=st.data())
    def requeue(self, data):
        rids = data.draw(
            st.lists(st.sampled_from(sorted(self.flight)), min_size=1, max_size=3, unique=True)
        )
        reqs = [self.flight.pop(rid)[0] for rid in rids]
        attempts = [r.attempt for r in reqs]
        self.core.requeue(reqs)
        assert [r.attempt for r in reqs] == [a + 1 for a in attempts]
        self.order[:0] = reqs

    @rule(engine=st.sampled_from(["e0", "e1", "e2"]), healthy=st.booleans())
    def health(self, engine, healthy):
        if engine in self.engines:
            self.core.set_engine_healthy(engine, healthy)
            self.healthy[engine] = healthy

    @rule(engine=st.sampled_from(["e0", "e1", "e2"]), tokens=st.integers(0, 500),
          elapsed=st.floats(0.0, 3.0, allow_nan=False))
    def delivery(self, engine, tokens, elapsed):
        if engine in self.engines:
            self.core.record_delivery(engine, tokens, elapsed)

    # ------------------------------------------------------------------ books
    @invariant()
    def books_match(self):
        if not hasattr(self, "core"):
            return
        core = self.core
        assert core.pending() == len(self.order)
        assert core.in_flight() == len(self.flight)
        assert sum(core.stats().pending_by_bucket.values()) == len(self.order)
        bal = core._bal
        gtok = core._gtok
        work = {rid: len(r.prompts[gtok] if gtok in r.prompts else next(iter(r.prompts.values())))
                + r.max_new_tokens for rid, r in self.all.items()}
        assert bal.pending_work == sum(work[r.request_id] for r in self.order)
        for i, eid in enumerate(bal.ids):
            held = [rid for rid, (_, e) in self.flight.items() if e == eid]
            assert bal.out_n[i] == len(held)
            assert bal.out_work[i] == sum(work[rid] for rid in held)
            assert (
                0 <= bal.pinned_n[i] <= len(self.order)
                and 0 <= bal.pinned_work[i] <= bal.pending_work
            )
        assert sum(bal.pinned_n) <= len(self.order)

    def teardown(self):
        if not hasattr(self, "core"):
            return
        core = self.core
        for eid in self.engines:
            core.set_engine_healthy(eid, True)
        for rid, (r, eid) in list(self.flight.items()):
            core.on_done(eid, r)
        self.flight.clear()
        # liveness: healthy, idle engines offered everything always make progress
        rounds = 0
        while core.pending():
            got = 0
            for eid, g in self.engines.items():
                for r in core.take(
                    eid, free_slots=g.max_batch_size, free_kv_blocks=g.kv_blocks_total
                ):
                    self.takes[r.request_id] = self.takes.get(r.request_id, 0) + 1
                    core.on_done(eid, r)
                    got += 1
            assert got, f"stuck: {core.pending()} pending, loads {core.loads()}"
            rounds += 1
            assert rounds < 10_000
        for rid, r in self.all.items():
            assert self.takes.get(rid, 0) == r.attempt + 1, (rid, self.takes.get(rid), r.attempt)
        s = core.stats()
        assert s.dispatched == sum(self.takes.values())
        assert 0 <= s.shared_prefix_tokens <= s.prompt_tokens
        assert 0 <= s.padded_tokens <= s.batch_tokens
        assert s.affinity_hits + s.affinity_spills <= s.dispatched


BrokerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestBroker = BrokerMachine.TestCase
