#!/usr/bin/env bash
# `forge bench control-plane --records 50000 --repeat 1` (card worker process, node pinned to core 0), a checkout of
# an older commit and this one alternately, one fresh process per cell (docs/benchmarks.md, "Cutting the node's CPU
# per task"):   BEFORE=/path/to/a/checkout/of/the/old/commit bash docs/bench/control_plane_rounds.sh [ROUNDS]
# Each row: round, which, 1-minute load average when it started, tasks done, window s, CPU s of the node process,
# µs of node CPU per task, tasks per node CPU-second.
set -u
AFTER=$(cd "$(dirname "$0")/../.." && pwd)
: "${BEFORE:?set BEFORE to a checkout of the commit to compare against}"
ROUNDS=${1:-5}; OUT=$(mktemp -d)
for r in $(seq 1 "$ROUNDS"); do
  for v in before after; do
    D=$AFTER; [ $v = before ] && D=$BEFORE
    L=$(cut -d' ' -f1 /proc/loadavg)
    (cd "$D" && PYTHONPATH=$D python -m forge bench control-plane --records 50000 --repeat 1 --out "$OUT/$v$r" \
      >/dev/null 2>&1)
    python3 -c "
import json; d = json.load(open('$OUT/$v$r/control-plane.json'))['control_plane']['runs'][0]
print(f\"| $r | $v | $L | {d['completed']} | {d['window_s']:.2f} | {d['cpu_s']:.2f} | {1e6 * d['cpu_s'] / d['completed']:.1f} | {d['requests_per_cpu_s']:,.0f} |\")"
  done
done
rm -rf "$OUT"
