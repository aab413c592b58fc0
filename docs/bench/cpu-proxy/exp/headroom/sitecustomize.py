# Experiment (docs/benchmarks.md, "The 8B's extra steps on the CPU proxy"): with HEADROOM=N the admission lets the
# engine hold N requests beyond its slots (its own queue fills a freed slot in the next step). Put on PYTHONPATH.
import os
if os.environ.get("HEADROOM"):
    import forge.host.admission as a
    _FT = a.FlightTable
    class FlightTable(_FT):
        def __init__(self, slots, kv_blocks):
            super().__init__(slots + int(os.environ["HEADROOM"]), kv_blocks)
    a.FlightTable = FlightTable
