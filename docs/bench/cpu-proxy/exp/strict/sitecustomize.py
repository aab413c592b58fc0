# Experiment (same section): with STRICT=1 a grouped take stops at an output class that still has work for the engine,
# so no shorter class joins a batch ahead of it. Put this directory on PYTHONPATH for one run.
import os
if os.environ.get("STRICT"):
    import forge.broker.batching as b
    from forge.broker.pending import priority_of

    def _has_work(self, i, level):
        for part in self.p.by_engine[i]:
            lv = part.levels.get(level)
            if lv is not None and (lv.owned.get(i) or lv.unowned):
                return True
        return False

    def _form_by_class(self, i, geom, slots, kv, drain):
        levels = self.p.priorities(i)
        while levels:
            prio = priority_of(levels[0])
            mine = [lv for lv in levels if priority_of(lv) == prio]
            levels = levels[len(mine):]
            take = b.Take(slots, kv, geom.max_num_tokens)
            for spill in (False, True):
                for level in mine:
                    self._form_grouped(i, geom, level, take, drain, spill)
                    if take.over(self):
                        break
                    if take.batch and _has_work(self, i, level):
                        break          # this class still has work for us: no shorter class jumps ahead of it
                if take.over(self) or (take.batch and not spill):
                    break
            if take.accessible:
                return take.batch
        return []
    b.Batcher._form_by_class = _form_by_class
