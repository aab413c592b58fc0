"""Batch forming for one engine: which pending requests it takes now, and in what shape.

A take walks at most `max_visits` prefix groups, so its cost follows the batch it returns, never
what is pending. Grouped: the output classes of one priority from the longest down (pending.py), one
length bucket per batch; in every class the engine's own prefix groups first, then unpinned groups
(pinned to it as it takes them); only then, room left, groups it may spill from. With
`strict_classes` (a broker of one engine) a take ends at a class that still has work for the engine
once the batch holds something: no shorter request is admitted ahead of a longer one that did not
fit this take (its length bucket, the step's budget or the free KV), so requests of one length
start, and end, together. FIFO: strict arrival order."""
from __future__ import annotations

from typing import Iterator, Optional

from forge.broker.dispatch import Balancer
from forge.broker.pending import HIT, NEW, SPILL, Entry, Pending, priority_of
from forge.broker.warming import Warming
from forge.prefix_blocks import BlockMirror, BoundedLRU, chain_hashes
from forge.broker.types import EngineGeometry


class Batcher:
    def __init__(
        self,
        pending: Pending,
        balancer: Balancer,
        pins: BoundedLRU,
        bucket_lower: list[int],
        grouping: bool,
        max_visits: int,
        strict_classes: bool = False,
        mirrors: Optional[list[BlockMirror]] = None,
        warming: Optional[Warming] = None,
    ):
        self.p, self.bal, self.pins = pending, balancer, pins
        self.bucket_lower, self.grouping, self.max_visits = bucket_lower, grouping, max_visits
        self.strict_classes = strict_classes
        # prefix warm-up (warming.py): a group cold on an engine sends its leader alone, the rest
        # once it is done
        self.mirrors, self.warming = mirrors, warming

    def form(self, i: int, g: EngineGeometry, free_slots: int, free_kv: int) -> list[Entry]:
        """One batch for engine i from the highest priority it may serve (empty if nothing fits
        now)."""
        drain = self.bal.drain_limit()  # constant during a take: work only moves pending -> held
        if self.grouping:
            batch = self._form_by_class(i, g, free_slots, free_kv, drain, gate=True)
            if not batch and self.warming is not None and not g.shares_prefix_within_step \
                    and self.bal.out_n[i] < self.bal.slots[i]:
                # work-conserving: nothing else to start and slots would idle, so followers go
                # before their leader is done (they recompute the prefix; an idle slot computes
                # nothing). An empty take changed no state.
                batch = self._form_by_class(i, g, free_slots, free_kv, drain, gate=False)
            return batch
        for prio in self.p.priorities(i):
            batch, accessible = self._form_fifo(i, g, prio, free_slots, free_kv, drain)
            if accessible:
                return batch
        return []

    def _form_by_class(self, i: int, geom: EngineGeometry, slots: int, kv: int, drain: float,
                       gate: bool) -> list[Entry]:
        """Grouped: the highest priority engine i may serve, its output classes longest first
        (pending.py)."""
        levels = self.p.priorities(i)
        while levels:
            prio = priority_of(levels[0])
            mine = [lv for lv in levels if priority_of(lv) == prio]
            levels = levels[len(mine):]
            take = Take(slots, kv, geom.max_num_tokens)
            for spill in (False, True):
                # its own and unowned groups first, every class; then the spill rules: a long class
                # pinned elsewhere is not spilled while the engine has shorter work of its own
                for level in mine:
                    self._form_grouped(i, geom, level, take, drain, spill, gate)
                    if take.over(self):
                        break
                    if self.strict_classes and take.batch and self.p.serves(i, level):
                        # this class still has work for us: nothing shorter jumps it
                        take.done = True
                        break
                if take.over(self):
                    break
            if take.accessible:
                return take.batch
        return []

    def _candidates(self, i: int, prio: int, drain: float, spill: bool) -> Iterator[tuple]:
        """Groups engine i may take from at this priority: its own pinned groups (round-robin), then
        unpinned ones (claimed while within the load bound), then groups pinned to engines that are
        overloaded or, in the tail, would finish their work after everyone else (see dispatch.py).

        Lazy and O(1) per group: the consumer rotates every visited group to the end of its dict (or
        moves or deletes it), so the next group is always the first one. `spill`: the groups it may
        spill from (True) or the others (False)."""
        parts = [(p, p.levels[prio]) for p in self.p.by_engine[i] if prio in p.levels]
        k, bal = self.max_visits, self.bal
        if spill:
            yield from self._spills(i, parts, drain)
            return
        for part, lvl in parts:
            own = lvl.owned.get(i)
            for _ in range(min(k, len(own) if own else 0)):
                if not own:
                    break
                yield part, lvl, next(iter(own.values())), HIT
        for part, lvl in parts:
            free = lvl.unowned
            for _ in range(min(k, len(free))):
                if not free:
                    break
                if bal.may_claim(i):
                    yield part, lvl, next(iter(free.values())), NEW
                else:  # over its bound: only prefix-less work, never a new pin
                    loose = free.get(None)
                    if loose is not None:
                        yield part, lvl, loose, NEW
                    break

    def _spills(self, i: int, parts: list, drain: float) -> Iterator[tuple]:
        k, bal = self.max_visits, self.bal
        mean_work = bal.pending_work / self.p.n if self.p.n else 0.0
        for part, lvl in parts:
            owners = sorted(
                (j for j in lvl.owned if j != i and self._spillable(i, j, mean_work, drain)),
                key=bal.overloaded,
                reverse=True,
            )
            for j in owners:
                theirs = lvl.owned.get(j)
                for _ in range(min(k, len(theirs) if theirs else 0)):
                    if not theirs or not self._spillable(i, j, mean_work, drain):
                        break
                    yield part, lvl, next(iter(theirs.values())), SPILL

    def _spillable(self, i: int, j: int, work: float, drain: float) -> bool:
        bal = self.bal
        return bal.overloaded(j) > 0 or bal.lags(j, work, drain) or bal.sooner(i, j, work)

    def _form_grouped(self, i, geom, prio, take: "Take", drain, spill: bool, gate: bool) -> None:
        """One level's part of the batch in `take` (see Take); `spill` as in _candidates."""
        bal, tok, tpb = self.bal, geom.tokenizer_key, geom.tokens_per_block
        batch = take.batch
        for part, lvl, grp, via in self._candidates(i, prio, drain, spill):
            take.visits += 1
            keyed = grp.key is not None
            if via == NEW and keyed and batch and not bal.may_claim(i, *grp.family_load()):
                # filling may not pin a group that would overload us
                lvl.unowned.move_to_end(grp.key)
                if take.visits >= self.max_visits:
                    take.done = True
                    return
                continue
            take.accessible = True
            warm = self.warming if keyed and gate and not geom.shares_prefix_within_step else None
            if warm is not None and warm.busy(i, grp.key):
                # its leader is computing the prefix here: the followers wait for it (its done wakes
                # the takers)
                (lvl.unowned if grp.owner is None else lvl.owned[grp.owner]).move_to_end(grp.key)
                if take.visits >= self.max_visits:
                    take.done = True
                    return
                continue
            share_with = None
            if via == SPILL:
                j = grp.owner
                if bal.overloaded(j) > 0 and self.p.owns_another(part, prio, j, grp.key) \
                        and bal.may_claim(i, *grp.family_load()):
                    self.p.move(lvl, grp, i)        # take the whole group over: it stays coherent
                else:
                    share_with = j  # its owner's only group: share it while j is over
            took = 0
            cold = None                             # decided at the group's first request that fits
            seed_qb = take.seed_qb
            qbs = grp.by_age() if seed_qb is None else ([seed_qb] if seed_qb in grp.buckets else [])
            for qb in qbs:
                dq = grp.buckets[qb]
                while dq:
                    e = dq[0]
                    req = e.req
                    n = len(req.prompts[tok])
                    blocks = -(-(n + req.max_new_tokens) // tpb)
                    if blocks > take.kv or (batch and n > take.budget):
                        break
                    if (
                        share_with is not None
                        and bal.overloaded(share_with) <= 0
                        and not (
                            bal.lags(share_with, e.work, drain)
                            and bal.faster(i, share_with, e.work)
                        )
                        and not bal.sooner(i, share_with, e.work)
                    ):
                        break  # its owner copes, would not finish it late, nor after us
                    if not bal.allows(i, e.work, part.mask, drain):
                        take.done = True
                        break
                    if warm is not None and cold is None:
                        cold = not self._cached(i, geom, e)
                    self.p.pop(lvl, grp, qb, dq)
                    bal.taken(i, e.work)
                    e.via = via if keyed else NEW
                    batch.append(e)
                    if cold:  # the leader goes alone; the followers once it is done
                        warm.start(i, grp.key, req.request_id)
                    took += 1
                    take.slots -= 1
                    take.kv -= blocks
                    if n > take.budget or take.slots == 0:      # an oversized prompt goes alone
                        take.done = True
                        break
                    take.budget -= n
                    if cold:
                        break
                if took or take.done:
                    if take.seed_qb is None and took:
                        take.seed_qb = qb
                    break
            if took and keyed and share_with is None:
                self.pins.put(grp.key, i)
            claimed = took and via == NEW and keyed
            if claimed:                    # with its family (other classes); lands at the end of
                self.p.claim(lvl, grp, i)  # the engine's groups, even if this one is emptied now
            if not grp.n:
                self.p.tidy(part, prio, lvl, grp)
            elif not claimed:                          # round-robin: the next take starts elsewhere
                (lvl.unowned if grp.owner is None else lvl.owned[grp.owner]).move_to_end(grp.key)
            if take.visits >= self.max_visits:
                take.done = True
            if take.over(self):
                return

    def _cached(self, i: int, geom: EngineGeometry, e: Entry) -> bool:
        """Whether engine i probably holds e's first block (its BlockMirror); a prompt without a
        full block of the engine's size has nothing to warm, so it counts as cached. The hashes are
        kept for the accounting."""
        view = (geom.tokenizer_key, geom.tokens_per_block)
        views = e.views
        hashes = views.get(view) if views is not None else None
        if hashes is None:
            hashes = chain_hashes(e.req.prompts[geom.tokenizer_key], geom.tokens_per_block)
            if views is None:
                e.views = views = {}
            views[view] = hashes
        return not hashes or self.mirrors[i].holds(hashes[0])

    def _form_fifo(self, i, geom, prio, slots, kv, drain):
        """Plain FIFO within the priority (merging partitions by arrival); stops at the first
        misfit."""
        bal, tok, tpb = self.bal, geom.tokenizer_key, geom.tokens_per_block
        budget = geom.max_num_tokens
        live = [(p, p.levels[prio]) for p in self.p.by_engine[i] if prio in p.levels]
        batch: list[Entry] = []
        while live and slots:
            part, lvl = (
                min(live, key=lambda pl: pl[1].groups[None].buckets[0][0].seq)
                if len(live) > 1
                else live[0]
            )
            grp = lvl.groups[None]
            dq = grp.buckets[0]
            e = dq[0]
            n = len(e.req.prompts[tok])
            blocks = -(-(n + e.req.max_new_tokens) // tpb)
            if blocks > kv or (batch and n > budget) or not bal.allows(i, e.work, part.mask, drain):
                break
            self.p.pop(lvl, grp, 0, dq)
            bal.taken(i, e.work)
            batch.append(e)
            slots -= 1
            kv -= blocks
            self.p.tidy(part, prio, lvl, grp)
            if not grp.n:
                live.remove((part, lvl))
            if n > budget:
                break
            budget -= n
        return batch, True


class Take:
    """One grouped take across the levels it walks: what is left of the engine's capacity, the batch
    so far, its length bucket (the first level that gives sets it; every level after fills from the
    same bucket), and the visits, bounded by max_visits for the whole take as one level's walk was
    before classes were levels."""

    __slots__ = ("slots", "kv", "budget", "batch", "seed_qb", "visits", "accessible", "done")

    def __init__(self, slots: int, kv: int, budget: int):
        self.slots, self.kv, self.budget = slots, kv, budget
        self.batch: list[Entry] = []
        self.seed_qb: Optional[int] = None
        self.visits = 0
        self.accessible = self.done = False

    def over(self, b: Batcher) -> bool:
        return self.done or (
            self.seed_qb is not None and self.budget < b.bucket_lower[self.seed_qb]
        )
