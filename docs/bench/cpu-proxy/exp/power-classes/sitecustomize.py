# Experiment (docs/benchmarks.md, "The eighth session"): with POWER_CLASSES=1 a one-engine broker orders bulk work by
# the power of two of max_new_tokens alone, as every broker did before 2026-12-02 (forge/broker/pending.py), so one
# call can run the shipped classes (32 to a power of two) against it. Put on PYTHONPATH ahead of another experiment's sitecustomize: that
# one runs too (Python itself imports only the first sitecustomize on the path). Without POWER_CLASSES it changes
# nothing.
import importlib.util
import os
import sys

if os.environ.get("POWER_CLASSES"):
    import forge.broker.core as _core

    _core.ONE_ENGINE_CLASS_BITS = 0

_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:
    _f = os.path.join(_p, "sitecustomize.py")
    if _p and os.path.abspath(_p) != _here and os.path.isfile(_f):
        _spec = importlib.util.spec_from_file_location("_next_sitecustomize", _f)
        _mod = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
        break
