# Experiment (docs/benchmarks.md, "forge ÷ direct: where the step time goes"): the card worker's driver thread
# wakes ~20 times a second instead of ~200 (50 ms poll slices, engine stats once a second, token counts once a
# second). Put on PYTHONPATH for one run.
import os
import sys

import forge.engines.hf.engine as engine
import forge.host.driver as driver

driver.COMMAND_LATENCY_S, driver.STATS_INTERVAL_S = 0.05, 1.0
engine._SLICE_S, engine.LIVE_COUNT_S = 0.05, 1.0
print(f"experiment: quiet driver in pid {os.getpid()}", file=sys.stderr)
