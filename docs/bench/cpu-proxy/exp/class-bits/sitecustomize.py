# Experiment (docs/benchmarks.md, "The eighth session"): with CLASS_BITS=N a one-engine broker splits each power of
# two of max_new_tokens into 2**N output classes instead of the shipped 32 (forge/broker/pending.py): 0 is the power
# of two alone, as every broker had before 2026-12-02, 2 quarters, 3 eighths, 5 the shipped width. So one call can
# run the shipped classes against another width. Put on PYTHONPATH ahead of another experiment's sitecustomize: that
# one runs too (Python itself imports only the first sitecustomize on the path). Without CLASS_BITS it changes
# nothing.
import importlib.util
import os
import sys

if os.environ.get("CLASS_BITS"):
    import forge.broker.core as _core
    import forge.broker.pending as _pending

    try:
        _bits = int(os.environ["CLASS_BITS"])
        if _bits < 0:
            raise ValueError
    except ValueError:      # sys.exit here would be a fatal error of site itself: one line, then out
        sys.stderr.write(f"CLASS_BITS: expected an integer >= 0, got {os.environ['CLASS_BITS']!r}\n")
        os._exit(2)
    if _bits > _pending.MAX_CLASS_BITS:      # room for the finer classes in every priority's levels
        _pending.MAX_CLASS_BITS = _bits
        _pending.CLASSES = 64 << _bits
        _pending.REQUEUED = _pending.CLASSES - 1
    _core.ONE_ENGINE_CLASS_BITS = _bits

_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:
    _f = os.path.join(_p, "sitecustomize.py")
    if _p and os.path.abspath(_p) != _here and os.path.isfile(_f):
        _spec = importlib.util.spec_from_file_location("_next_sitecustomize", _f)
        _mod = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
        break
