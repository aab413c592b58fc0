# Experiment (docs/benchmarks.md, "The fourth session on the H200"): with ONEBUCKET=1 the broker keeps one prompt-length
# bucket, so a grouped take is not held to one bucket. Put this directory on PYTHONPATH for one run.
import os
if os.environ.get("ONEBUCKET"):
    import forge.broker.geometry as g
    _init = g.LengthBuckets.__init__
    def __init__(self, max_len, boundaries=None):
        _init(self, max_len, [max_len])
    g.LengthBuckets.__init__ = __init__
