"""Pending requests, indexed so that adding, taking and requeueing never scan what is pending.

Layout: partition (the set of engines a request fits, as a bit mask) -> priority level -> prefix
group -> length bucket -> queue. A level keeps each group in one of two places: pinned to an engine
(`owned[engine]`, ordered for round-robin) or `unowned`. batching.py forms batches from it.

Every queue is FIFO (a requeued request goes to its front). With grouping on, a level is a priority
*and an output class*: bulk requests asking for more new tokens sit in a higher level of their
priority, so takes serve them first, across every prefix group (batching.py fills a batch down the
classes of one priority); online priorities keep one level, arrival order (output_class). A batch
job's last minutes are its tail, where the engine runs ever fewer requests at the cost of full steps
until the longest of the last ones ends; taking the longest first leaves short ones for the end, so
the tail is as short as the work allows (docs/broker.md, "Longest first"; measured in
docs/benchmarks.md). A class is a power of two of max_new_tokens (16-31, 32-63, ...) split into
2**class_bits parts: for a broker of one engine 32 parts (every length below 64 a class of its own,
then classes about 3 % wide), where class width costs a longer tail and a schedule of more distinct
step shapes; whole powers of two for several, where finer classes pull an engine across more prefix
families (more spills, less prefix reuse). Grouping off keeps one level per priority: arrival order,
the baseline."""
from __future__ import annotations

from bisect import insort
from collections import OrderedDict, deque
from typing import Iterator, Optional

from forge.broker.dispatch import Balancer
from forge.prefix_blocks import BoundedLRU
from forge.broker.types import BrokerRequest

NEW, HIT, SPILL = 0, 1, 2        # how a request reached its engine (unpinned / its pin / spilled)
MAX_CLASS_BITS = 5  # a power of two splits into at most 2**MAX_CLASS_BITS output classes
# output classes per priority level (max_new_tokens.bit_length() < 64)
CLASSES = 64 << MAX_CLASS_BITS
REQUEUED = CLASSES - 1  # the class of requeued work: before every other class of its priority
ONE_ENGINE_CLASS_BITS = 5  # a one-engine broker's classes: 32 to a power of two (module docstring)


def level_key(priority: int, out_class: int) -> int:
    """One int orders levels: priority first, then output class (both descending in a take)."""
    return priority * CLASSES + out_class


def priority_of(level: int) -> int:
    return level // CLASSES


def output_class(req, class_bits: int = 0) -> int:
    """The level of a request within its priority. Bulk work (priority 0 or below) goes by
    max_new_tokens, longest first (a job's makespan): its power of two, and within it the next
    `class_bits` bits (0: the power of two alone, 2: quarters, 5: 32 parts). Online work (above 0;
    serve's ONLINE_PRIORITY) is latency work, for which longest first is the wrong rule (it makes
    short requests wait behind long ones): one level, arrival order."""
    if req.priority > 0:
        return 0
    n = req.max_new_tokens
    top = n.bit_length()
    # bits after the leading one
    part = ((n << class_bits) >> (top - 1)) & ((1 << class_bits) - 1) if top else 0
    return min((top << MAX_CLASS_BITS) | (part << (MAX_CLASS_BITS - class_bits)), REQUEUED - 1)


class Entry:
    """The broker's record of one pending or in-flight request."""

    __slots__ = ("req", "seq", "mask", "work", "key", "qb", "bucket", "views", "via")

    def __init__(
        self,
        req: BrokerRequest,
        seq: int,
        mask: int,
        work: int,
        key: Optional[int],
        qb: int,
        bucket: int,
    ):
        self.req, self.seq, self.mask, self.work = req, seq, mask, work
        self.key, self.qb, self.bucket = key, qb, bucket
        # (tokenizer_key, tokens_per_block) -> chain hashes, lazily
        self.views: Optional[dict] = None
        self.via = NEW


class Fifo(deque):
    """A bucket's queue in arrival order, requeued requests at its front (so its head is also its
    oldest)."""

    def oldest(self) -> "Entry":
        return self[0]


class Group:
    __slots__ = ("key", "owner", "buckets", "n", "work", "lvl", "family")

    def __init__(
        self, key: Optional[int], owner: Optional[int], lvl: "Level", family: Optional[dict] = None
    ):
        self.key, self.owner, self.lvl = key, owner, lvl
        self.buckets: dict[int, deque] = {}
        self.n = self.work = 0
        # the same prefix key's groups at the other output classes of its priority (level key ->
        # Group, itself included): one family, one owner — claimed, moved and released together
        # (None: no siblings possible)
        self.family = family

    def siblings(self) -> Iterator["Group"]:
        return iter(self.family.values()) if self.family is not None else iter((self,))

    def family_load(self) -> tuple[int, int]:
        """(work, requests) pending in the whole family: what a claim or a move pins."""
        if self.family is None or len(self.family) == 1:
            return self.work, self.n
        return sum(g.work for g in self.family.values()), sum(g.n for g in self.family.values())

    def by_age(self) -> list[int]:
        """Bucket ids, the one holding the oldest request first (a handful of buckets at most)."""
        b = self.buckets
        return sorted(b, key=lambda q: b[q].oldest().seq) if len(b) > 1 else list(b)


class Level:
    __slots__ = ("groups", "owned", "unowned", "n")

    def __init__(self):
        self.groups: dict = {}
        self.owned: dict[int, OrderedDict] = {}
        self.unowned: OrderedDict = OrderedDict()
        self.n = 0


class Partition:
    __slots__ = ("mask", "levels", "neg_prios", "families")

    def __init__(self, mask: int):
        self.mask = mask
        self.levels: dict[int, Level] = {}
        self.neg_prios: list[int] = []  # -level key, ascending: highest priority (and class) first
        # (priority, prefix key) -> {level key: Group} (grouping on)
        self.families: dict[tuple, dict] = {}


class Pending:
    def __init__(self, n_engines: int, n_buckets: int, balancer: Balancer, pins: BoundedLRU, *,
                 class_levels: bool = False, class_bits: int = 0):
        if not 0 <= class_bits <= MAX_CLASS_BITS:
            raise ValueError(f"class_bits must be 0..{MAX_CLASS_BITS}, got {class_bits}")
        self.bal, self.pins = balancer, pins
        self.class_levels = class_levels      # grouping on: output classes are levels (see above)
        self.class_bits = class_bits
        self.parts: dict[int, Partition] = {}
        self.by_engine: list[list[Partition]] = [[] for _ in range(n_engines)]   # narrowest first
        self.n = 0
        self.bucket_counts = [0] * n_buckets

    # ------------------------------------------------------------------ in and out
    def push(self, e: Entry, front: bool = False) -> None:
        part = self.parts.get(e.mask) or self._new_partition(e.mask)
        prio = e.req.priority
        if self.class_levels:
            prio = level_key(prio, REQUEUED if front else output_class(e.req, self.class_bits))
        lvl = part.levels.get(prio)
        if lvl is None:
            lvl = part.levels[prio] = Level()
            insort(part.neg_prios, -prio)
        g = lvl.groups.get(e.key)
        if g is None:
            family = None
            owner = None
            if self.class_levels and e.key is not None:
                family = part.families.setdefault((e.req.priority, e.key), {})
                if family:                         # its siblings' owner, whatever the pins say now
                    owner = next(iter(family.values())).owner
            if not family:
                owner = self._pinned_owner(e.key, part.mask)
            g = lvl.groups[e.key] = Group(e.key, owner, lvl, family)
            if family is not None:
                family[prio] = g
            if g.owner is None:
                lvl.unowned[e.key] = g
            else:
                lvl.owned.setdefault(g.owner, OrderedDict())[e.key] = g
        dq = g.buckets.get(e.qb)
        if dq is None:
            dq = g.buckets[e.qb] = Fifo()
        if front:                                  # a requeued request: its group is served next
            dq.appendleft(e)
            (lvl.unowned if g.owner is None else lvl.owned[g.owner]).move_to_end(e.key, last=False)
        else:
            dq.append(e)
        g.n += 1
        g.work += e.work
        lvl.n += 1
        self.n += 1
        self.bucket_counts[e.bucket] += 1
        self.bal.pending_work += e.work
        if g.owner is not None:
            self.bal.pinned_work[g.owner] += e.work
            self.bal.pinned_n[g.owner] += 1

    def _pinned_owner(self, key, mask: int) -> Optional[int]:
        if key is None:
            return None
        o = self.pins.get(key)
        return o if o is not None and (mask >> o) & 1 and self.bal.healthy[o] else None

    def _new_partition(self, mask: int) -> Partition:
        part = self.parts[mask] = Partition(mask)
        for i, lst in enumerate(self.by_engine):
            if (mask >> i) & 1:
                lst.append(part)
                lst.sort(key=lambda p: bin(p.mask).count("1"))   # specialised work first
        return part

    def pop(self, lvl: Level, g: Group, qb: int, dq: deque) -> Entry:
        e = dq.popleft()
        if not dq:
            del g.buckets[qb]
        g.n -= 1
        g.work -= e.work
        lvl.n -= 1
        self.n -= 1
        self.bucket_counts[e.bucket] -= 1
        if g.owner is not None:
            self.bal.pinned_work[g.owner] -= e.work
            self.bal.pinned_n[g.owner] -= 1
        return e

    def tidy(self, part: Partition, prio: int, lvl: Level, g: Group) -> None:
        """Drop an emptied group, and its level when that empties too."""
        if g.n:
            return
        del lvl.groups[g.key]
        if g.family is not None:
            del g.family[prio]
            if not g.family:
                del part.families[(priority_of(prio), g.key)]
        if g.owner is None:
            del lvl.unowned[g.key]
        else:
            own = lvl.owned[g.owner]
            del own[g.key]
            if not own:
                del lvl.owned[g.owner]
        if not lvl.n:
            del part.levels[prio]
            part.neg_prios.remove(-prio)

    def release(self, i: int) -> None:
        """Engine i went unhealthy: its pinned groups (whole families: every level is walked) become
        anyone's."""
        for part in self.by_engine[i]:
            for lvl in part.levels.values():
                for g in (lvl.owned.pop(i, None) or {}).values():
                    g.owner = None
                    lvl.unowned[g.key] = g
        self.bal.pinned_work[i] = 0
        self.bal.pinned_n[i] = 0

    def claim(self, lvl: Level, g: Group, i: int) -> None:
        """Pin an unowned group to engine i, with its family (every output class of its key and
        priority)."""
        for s in g.siblings():
            self._reown(s, i)

    def move(self, lvl: Level, g: Group, i: int) -> None:
        """Re-pin a group and its family from an overloaded engine to engine i (bounded-load: the
        key moves on)."""
        for s in g.siblings():
            self._reown(s, i)
        self.pins.put(g.key, i)

    def _reown(self, g: Group, i: int) -> None:
        """Group g (unowned, or another engine's) becomes engine i's, its pending work counted to
        i."""
        lv, j = g.lvl, g.owner
        if j is None:
            del lv.unowned[g.key]
        else:
            theirs = lv.owned[j]
            del theirs[g.key]
            if not theirs:
                del lv.owned[j]
            self.bal.pinned_work[j] -= g.work
            self.bal.pinned_n[j] -= g.n
        g.owner = i
        lv.owned.setdefault(i, OrderedDict())[g.key] = g
        self.bal.pinned_work[i] += g.work
        self.bal.pinned_n[i] += g.n

    def owns_another(self, part: Partition, level: int, j: int, key) -> bool:
        """Whether engine j owns a prefix family other than `key` at `level`'s priority in this
        partition (grouped mode; a few class levels, and at most two keys looked at in each)."""
        prio = priority_of(level)
        for lk, lv in part.levels.items():
            if priority_of(lk) == prio:
                for k in lv.owned.get(j, ()):
                    if k != key:
                        return True
        return False

    def drain(self) -> list[Entry]:
        out = []
        for part in self.parts.values():
            for lvl in part.levels.values():
                for g in lvl.groups.values():
                    for dq in g.buckets.values():
                        out.extend(dq)
            part.levels.clear()
            part.neg_prios.clear()
            part.families.clear()
        out.sort(key=lambda e: (-e.req.priority, e.seq))
        self.n = 0
        self.bucket_counts = [0] * len(self.bucket_counts)
        self.bal.pending_work = 0
        self.bal.pinned_work = [0] * len(self.bal.pinned_work)
        self.bal.pinned_n = [0] * len(self.bal.pinned_n)
        return out

    def serves(self, i: int, level: int) -> bool:
        """Whether a level holds work engine i may take without spilling: its own groups or unowned
        ones."""
        for part in self.by_engine[i]:
            lvl = part.levels.get(level)
            if lvl is not None and (lvl.owned.get(i) or lvl.unowned):
                return True
        return False

    def priorities(self, i: int) -> list[int]:
        """Levels (priorities, or with grouping on priority x output class) with work engine i fits,
        highest first."""
        parts = self.by_engine[i]
        if len(parts) == 1:
            return [-p for p in parts[0].neg_prios]
        return sorted({-p for part in parts for p in part.neg_prios}, reverse=True)
