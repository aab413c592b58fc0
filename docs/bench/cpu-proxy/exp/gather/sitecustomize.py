# Experiment (same section): with GATHER_S=0.3 each engine's first broker take waits that long, so the broker sees more
# of a finite job before it orders the first batches. Put this directory on PYTHONPATH for one run.
import os
if os.environ.get("GATHER_S"):
    import asyncio
    import forge.broker.queue as q
    _take = q.Broker.take
    _first = {}
    async def take(self, engine_id, **kw):
        if engine_id not in _first:
            _first[engine_id] = True
            await asyncio.sleep(float(os.environ["GATHER_S"]))
        return await _take(self, engine_id, **kw)
    q.Broker.take = take
