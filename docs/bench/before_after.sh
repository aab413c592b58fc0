#!/usr/bin/env bash
# Before/after, interleaved, on this machine (docs/benchmarks.md, "Every card in its own process"):
#   BEFORE=/path/to/a/checkout/of/the/old/commit bash docs/bench/before_after.sh readme|control-plane [ROUNDS]
# readme:        the README's main command, start to finish, timed with /usr/bin/time (wall, user, sys)
# control-plane: `forge bench control-plane --records 50000 --repeat 1`, before / --card-transport thread /
#                process, tasks per CPU-second of the node process
# Each row is printed as a Markdown table row with the 1-minute load average when it started.
set -u
AFTER=$(cd "$(dirname "$0")/../.." && pwd)
: "${BEFORE:?set BEFORE to a checkout of the commit to compare against}"
WHAT=${1:?readme or control-plane}; ROUNDS=${2:-5}
OUT=$(mktemp -d)
load() { cut -d' ' -f1 /proc/loadavg; }
for r in $(seq 1 "$ROUNDS"); do
  if [ "$WHAT" = readme ]; then
    for v in before after; do
      D=$AFTER; [ $v = before ] && D=$BEFORE
      L=$(load); rm -rf "$OUT/$v"; mkdir -p "$OUT/$v"
      T=$( { cd "$D" && PYTHONPATH=$D /usr/bin/time -f "%e %U %S" python -m forge run functions/summarize.py \
             --input functions/data/summarize.jsonl --output "$OUT/$v/summarize.jsonl" >/dev/null 2>"$OUT/$v/err"; } 2>&1
           tail -1 "$OUT/$v/err")
      echo "| $r | $v | $L | $T | $(wc -l < "$OUT/$v/summarize.jsonl") rows |"
    done
    if cmp -s <(sort "$OUT/before/summarize.jsonl") <(sort "$OUT/after/summarize.jsonl"); then
      echo "|   | (rows) | | the same rows before and after | |"
    else
      echo "|   | (rows) | | DIFFERENT rows before and after | |"
    fi
  else
    for v in before thread process; do
      D=$AFTER; A="--card-transport $v"; [ $v = before ] && { D=$BEFORE; A=""; }
      L=$(load)
      (cd "$D" && PYTHONPATH=$D python -m forge bench control-plane --records 50000 --repeat 1 --out "$OUT/$v$r" $A \
        >/dev/null 2>&1)
      python3 -c "
import json; d = json.load(open('$OUT/$v$r/control-plane.json'))['control_plane']['runs'][0]
print(f\"| $r | $v | $L | {d['completed']} | {d['window_s']:.2f} | {d['cpu_s']:.2f} | {d['requests_per_cpu_s']:,.0f} |\")"
    done
  fi
done
rm -rf "$OUT"
