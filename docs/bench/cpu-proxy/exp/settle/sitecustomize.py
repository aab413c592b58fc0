# Experiment (docs/benchmarks.md, "The tenth session on the H200", last part): with SETTLE_S=1.0 a broker take returns
# nothing while requests are still arriving in a burst (the last add under 50 ms ago) and the burst began under
# SETTLE_S ago, so the first batches of a job are ordered over the whole burst, not over the records that happened
# to land first. Loads exp/shapes beside it (SHAPES=DIR). Put this directory on PYTHONPATH for one run.
import os
import time

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shapes", "sitecustomize.py")
exec(compile(open(_path).read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})

if os.environ.get("SETTLE_S"):
    import forge.broker.core as _core

    _add, _take = _core.BrokerCore.add, _core.BrokerCore.take
    _burst = {}                                   # core -> [burst start, last add]

    def add(self, req, *args, **kwargs):
        now = time.monotonic()
        b = _burst.setdefault(id(self), [now, now])
        if now - b[1] > 0.2:                      # a gap: a new burst of arrivals begins
            b[0] = now
        b[1] = now
        return _add(self, req, *args, **kwargs)

    def take(self, *args, **kwargs):
        b, now = _burst.get(id(self)), time.monotonic()
        if b is not None and now - b[1] < 0.05 and now - b[0] < float(os.environ["SETTLE_S"]):
            return []                             # still arriving: let the burst land first
        return _take(self, *args, **kwargs)

    _core.BrokerCore.add, _core.BrokerCore.take = add, take
