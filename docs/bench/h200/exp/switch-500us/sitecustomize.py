# Experiment (docs/benchmarks.md, "forge ÷ direct: where the step time goes"): every Python process of the run
# (the bench and its card worker) hands the GIL over after 0.5 ms instead of 5 ms. Put on PYTHONPATH for one run.
import os
import sys

sys.setswitchinterval(0.0005)
print(f"experiment: switch interval {sys.getswitchinterval()} s in pid {os.getpid()}", file=sys.stderr)
