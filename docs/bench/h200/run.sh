#!/usr/bin/env bash
# The GPU captures of docs/benchmarks.md, as run on the device machine (one NVIDIA H200) from the repo root:
#   bash docs/bench/h200/run.sh STAGE [STAGE...]      (stages: the case labels below)
# call 1: env demo mixed-1p5b prefix-1p5b; call 2: mixed-1p5b-gate prefix-1p5b-gate prefix-short-1p5b mixed-8b
# sweep-1p5b (then: budget x slots only, `--records 96 --tokens 2048,8192,16384 --slots 64,128`); call 3: mixed-1p5b-repeat; call 4: prefix-1p5b-credit
# prefix-short-1p5b-credit. Issue 16 (one call each): sweep-1p5b, sweep-8b, confirm-1p5b, confirm-8b.
# issue 14: scaling-cpu (the device's CPUs, no GPU used; one call); last call: final-1p5b-df. Issue 17: cards-2x1p5b and cards-1p5b-8b (two H200s,
# kind nvidia-h200-x2; one call each; every window's GPU utilisation per card is in bench.json/bench.md), and
# starts-2card (each two-card node from a fresh `forge provision` process STARTS=3 times: time to ready, /health's
# healthy cards, exit code after SIGTERM; docs/bench/fresh_starts.py). CARD_TRANSPORT=thread|process picks where the
# engines run (default process). Sixth session (docs/benchmarks.md): lpt-child-3 (call V), noise-1p5b-6 (W),
# timeline-1p5b (X), replays (Y; REPLAYS="NAME..." of .replay/NAME.jsonl with .replay/in.pickle, carried). Seventh
# session: timeline-8b (Z), warm-8b-3 (AA), warm2-8b-3 (AB); ready, not run: warm-1p5b-fast-3, precapture-8b,
# precapture-all-8b, pad-8b. Ninth session: cp50k lpt-threads-3 lpt-threads-3b (call AC), warm2-8b-3 (AD), cp50k
# warm-1p5b-fast-3 (AE); ready, not run: classes-1p5b, classes-8b-warm, precapture-8b, precapture-all-8b, pad-8b,
# precapture-1p5b-fast, precapture-all-1p5b-fast. Tenth session: precapture-1p5b-fast (AF), precapture-all-1p5b-fast
# (AG), precapture-all-8b (AH), cached-1p5b-fast cached-8b-2 (AI, both cut before their last run). Eleventh session:
# cached-8b-3 (AJ, AM), cached-1p5b-fast (AK, AL); ready, not run: classes-*, pad-8b.
# forge's own Python dependencies missing from the device image travel as wheels in .whl/ (see the README of
# the device tool); transformers 5.24.0 travels too (the image has 5.17). Results go to $OUT/results.tgz,
# the log to $OUT/log.txt. Every stage has its own time limit, so one stuck stage cannot eat the call.
set -u
OUT=${OUT:-/tmp/forge-bench-out}
R=/tmp/forge-bench-results
# a machine held across calls keeps /tmp: start from an empty results folder, so no call packs an earlier one's logs
rm -rf "$R"
mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F="python3 -m forge"
H=docs/bench/h200
W=docs/bench/workloads

DEADLINE=${DEADLINE:-560}     # seconds after start by which every stage has ended (the call's limit is 600)
pack() { tar czf "$OUT/results.tgz" --exclude='*.sqlite*' --exclude='records.jsonl' -C "$R" . ; }
stage() {  # name limit_s command...
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -le 5 ] && { echo "=== $name: skipped, no time left"; return; }
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
  pack
}

# The sweep (forge bench sweep) of one tier: every candidate in its own process under --candidate-limit, the whole
# sweep under a --deadline taken from the time this stage has left, so it ends with its report before `timeout`
# would stop it. The winner is written as CONTRACT-fast.yaml + node-…-fast.yaml into $TIERS (default: beside the
# shipped tiers, so its paths are right for docs/bench/h200/ and the confirm stages of this call find it) and
# copied into the capture folder.
sweep() {  # name limit_s contract node records confirm_records [extra sweep flags...]
  local name=$1 limit=$2 contract=$3 node=$4 recs=$5 crecs=$6; shift 6
  local tiers=${TIERS:-$H} newnode
  newnode=node-${contract#h200-}-fast.yaml
  local left=$((DEADLINE - SECONDS)); [ "$left" -gt "$limit" ] && left=$limit
  left=$((left - 20))
  [ "$left" -lt 30 ] && { echo "=== $name: skipped, no time left"; return; }
  mkdir -p "$R/$name" "$tiers"
  stage "$name" "$limit" $F bench sweep "$contract" --workload "$WL" --node "$node" --records "$recs" \
    --confirm-records "$crecs" --confirm-repeat 2 --candidate-limit "${CANDIDATE_LIMIT:-75}" --deadline "$left" \
    --out "$R/$name" --write-best "$tiers/$contract-fast.yaml" --best-name "$contract-fast" \
    --write-best-node "$tiers/$newnode" "$@"
  cp "$tiers/$contract-fast.yaml" "$tiers/$newnode" "$R/$name/" 2>/dev/null; pack
}
# New vs shipped tier, interleaved in one process, through forge and direct (same switches): the issue's ratios
# (new ÷ shipped through forge, forge ÷ direct on the new tier) and each tier's time beside the hardware bounds.
compare() {  # name limit_s records shipped_node new_node
  local name=$1 limit=$2 recs=$3 shipped=$4 new=$5
  [ -f "$new" ] || { echo "=== $name: skipped, no new tier at $new (run the sweep stage, or set NEW_1P5B / NEW_8B)"; return; }
  stage "$name" "$limit" $F bench compare "$WL" --node "$shipped" --label shipped --node "$new" --label new \
    --modes forge,direct --repeat 2 --records "$recs" --out "$R/$name"
}
# The shipped 1.5B tier, 512 records, direct longest first against forge, with an experiment's sitecustomize
# (docs/bench/h200/exp/EXP, holding the step timer) in every process; then the step log cut to each run's window.
timed_1p5b() {  # name limit_s exp [extra bench-run flags...]
  local name=$1 limit=$2 exp=$3; shift 3
  mkdir -p "$R/$name/steplog" "$R/$name/threadlog"
  stage "$name" "$limit" env STEPLOG="$R/$name/steplog" THREADLOG="$R/$name/threadlog" \
    PYTHONPATH="$PWD/$H/exp/$exp:$PYTHONPATH" \
    $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 --out "$R/$name" \
    --modes direct,forge --direct longest --card-transport process "$@"
  python3 docs/bench/steplog_summary.py "$R/$name/steplog" "$R/$name/bench.json" | tee "$R/$name/steplog.md"
  python3 docs/bench/threadcpu_summary.py "$R/$name/threadlog" "$R/$name/bench.json" > "$R/$name/threadcpu.md"
  pack
}
# forge's schedule at the direct mode's cost per step: one bench (direct longest, forge; REPEATS) recording what
# entered the scheduler at which step (exp/timeline), then each recorded timeline of the first repeat replayed on a
# fresh engine without forge (replay_timeline.py), forge's and direct's alternating, twice
timeline() {  # name bench_limit_s replay_limit_s node records repeats
  local name=$1 limit=$2 rlimit=$3 node=$4 recs=$5 reps=$6 d="$R/$1" inp tl_forge tl_direct tl i which
  mkdir -p "$d/steplog" "$d/threadlog" "$d/timeline" "$d/replay-steplog"
  stage "$name" "$limit" env STEPLOG="$d/steplog" THREADLOG="$d/threadlog" TIMELINE="$d/timeline" \
    PYTHONPATH="$PWD/$H/exp/timeline:$PYTHONPATH" \
    $F bench run $W/gpu-mixed.yaml --node "$node" --records "$recs" --out "$d" \
    --modes direct,forge --direct longest --card-transport process --repeat "$reps" --direct-process child
  python3 docs/bench/steplog_summary.py "$d/steplog" "$d/bench.json" | tee "$d/steplog.md"
  python3 docs/bench/threadcpu_summary.py "$d/threadlog" "$d/bench.json" > "$d/threadcpu.md"
  inp=$(ls "$d"/work/direct-1-*.in.pickle | head -1)
  tl_forge=$(grep -l "forge.host" "$d"/timeline/*.cmd | head -1); tl_direct=$(grep -l "direct_child" "$d"/timeline/*.cmd | head -1)
  echo "timelines: forge ${tl_forge%.cmd}.jsonl direct ${tl_direct%.cmd}.jsonl"
  i=0
  for which in forge direct direct forge; do
    i=$((i + 1)); tl=$tl_forge; [ $which = direct ] && tl=$tl_direct
    stage "replay-$i-$which" "$rlimit" env STEPLOG="$d/replay-steplog" TIMELINE="$d/timeline" PYTHONPATH="$PWD/$H/exp/timeline:$PYTHONPATH" \
      python3 docs/bench/h200/replay_timeline.py "$inp" "${tl%.cmd}.jsonl" "$recs" "$d/replay-$i-$which.json"
  done
  python3 docs/bench/h200/graph_captures.py "$d/timeline" "$d/bench.json" "$d"/replay-*.json | tee "$d/graphs.md"
  pack
}
# forge against direct with both engines warm: before each measured run, one whole job of other records through the
# same engine (forge: its node; direct: the manager its window uses; --warm-jobs 1), so neither window pays the CUDA
# graph captures of a fresh engine (call Z: 18 captures, 4.8 s of direct's 22.6 s window on the 8B fast tier, 34 and
# 9.1 s of forge's 24.9 s). The recorder (exp/timeline) logs every capture; graph_captures.py counts them per window.
warm_pair() {  # name limit_s node records repeats [warm_jobs, default 1]
  local name=$1 limit=$2 node=$3 recs=$4 reps=$5 wj=${6:-1} d="$R/$1"
  mkdir -p "$d/steplog" "$d/timeline"
  stage "$name" "$limit" env STEPLOG="$d/steplog" TIMELINE="$d/timeline" PYTHONPATH="$PWD/$H/exp/timeline:$PYTHONPATH" \
    $F bench run $W/gpu-mixed.yaml --node "$node" --records "$recs" --out "$d" --modes direct,forge \
    --direct longest --card-transport process --repeat "$reps" --warm-jobs "$wj"
  python3 docs/bench/steplog_summary.py "$d/steplog" "$d/bench.json" | tee "$d/steplog.md"
  python3 docs/bench/h200/graph_captures.py "$d/timeline" "$d/bench.json" | tee "$d/graphs.md"
  rm -f "$d"/timeline/*[0-9].jsonl          # the request timelines (MBs); the capture logs stay
  pack
}
# The shipped one-engine classes (32 to a power of two) against the power of two (exp/class-bits), alternating
# invocations, each direct longest
# then forge, one repeat each, with the step log and CUDA-graph capture log (exp/timeline) of every window.
classes() {  # name limit_s_per_invocation node records warm_jobs
  local name=$1 limit=$2 node=$3 recs=$4 wj=$5 k v
  for k in 1 2; do for v in fine power; do
    local d="$R/$name/$v-$k"; mkdir -p "$d/steplog" "$d/timeline"
    stage "$name-$v-$k" "$limit" env STEPLOG="$d/steplog" TIMELINE="$d/timeline" \
      CLASS_BITS=$([ $v = power ] && echo 0) \
      PYTHONPATH="$PWD/docs/bench/cpu-proxy/exp/class-bits:$PWD/$H/exp/timeline:$PYTHONPATH" \
      $F bench run $W/gpu-mixed.yaml --node "$node" --records "$recs" --out "$d" --modes direct,forge \
      --direct longest --card-transport process --repeat 1 --warm-jobs "$wj"
    python3 docs/bench/steplog_summary.py "$d/steplog" "$d/bench.json" > "$d/steplog.md"
    python3 docs/bench/h200/graph_captures.py "$d/timeline" "$d/bench.json" > "$d/graphs.md"
    rm -f "$d"/timeline/*[0-9].jsonl
    pack
  done; done
}
# A fast tier cold, 3 interleaved repeats, with exp/precapture in the processes whose command line holds $3 (the
# shapes: the capture logs committed under $6), captures per window. The 8B fast tier (256 records) takes its shapes
# from the calls of 2026-12-01, the 1.5B fast tier (512) from call AE (2026-12-02).
precap() {  # name limit_s where node records shapes_dir
  local name=$1 limit=$2 where=$3 node=$4 recs=$5 shapes=$6 d="$R/$1"
  mkdir -p "$d/steplog" "$d/timeline"
  stage "$name" "$limit" env PRECAPTURE="$shapes" PRECAPTURE_IN="$where" PRECAPTURE_S=120 \
    STEPLOG="$d/steplog" TIMELINE="$d/timeline" PYTHONPATH="$PWD/$H/exp/precapture:$PYTHONPATH" \
    $F bench run $W/gpu-mixed.yaml --node "$node" --records "$recs" --out "$d" --modes direct,forge \
    --direct longest --card-transport process --repeat 3
  python3 docs/bench/steplog_summary.py "$d/steplog" "$d/bench.json" | tee "$d/steplog.md"
  python3 docs/bench/h200/graph_captures.py "$d/timeline" "$d/bench.json" | tee "$d/graphs.md"
  rm -f "$d"/timeline/*[0-9].jsonl
  pack
}
# The product path of the same: the fast tiers name a graph_shape_cache (docs/bench/h200/graph-shapes/, the shapes
# calls Z-AH met), so forge's engine and the direct mode (the same tier) both capture them at load; cold engines, the
# capture log (exp/timeline) counts what is left in each window. The caches as they were before and after the stage
# (every engine adds the shapes it met when it stops) go into the capture folder.
cached() {  # name limit_s node records repeat
  local name=$1 limit=$2 node=$3 recs=$4 rep=$5 d="$R/$1"
  mkdir -p "$d/steplog" "$d/timeline" "$d/shapes-before" "$d/shapes-after"
  cp $H/graph-shapes/*.jsonl "$d/shapes-before/"
  stage "$name" "$limit" env STEPLOG="$d/steplog" TIMELINE="$d/timeline" PYTHONPATH="$PWD/$H/exp/timeline:$PYTHONPATH" \
    $F bench run $W/gpu-mixed.yaml --node "$node" --records "$recs" --out "$d" --modes direct,forge \
    --direct longest --card-transport process --repeat "$rep"
  cp $H/graph-shapes/*.jsonl "$d/shapes-after/"
  python3 docs/bench/steplog_summary.py "$d/steplog" "$d/bench.json" | tee "$d/steplog.md"
  python3 docs/bench/h200/graph_captures.py "$d/timeline" "$d/bench.json" | tee "$d/graphs.md"
  rm -f "$d"/timeline/*[0-9].jsonl
  pack
}
# An experiment's patch on this copy of the tree, for one stage (-R takes it off again); git or patch(1).
patch_tree() {  # [-R] file
  local rev=""; [ "$1" = "-R" ] && { rev="-R"; shift; }
  if git rev-parse --git-dir >/dev/null 2>&1; then git apply $rev "$1"; else patch -p1 -s --forward $rev < "$1"; fi
}
# the new tiers: written beside the shipped ones by this call's sweep stage, or committed there by the lead
NEW_1P5B=${NEW_1P5B:-$H/node-llama-1p5b-fast.yaml}
NEW_8B=${NEW_8B:-$H/node-llama-8b-fast.yaml}
WL=$W/gpu-mixed.yaml

for s in "$@"; do case $s in
  env)
    stage env 120 bash -c "nvidia-smi; python3 -c 'import torch, transformers, pydantic, sys; print(sys.version); \
print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.get_device_name(0)); \
print(\"transformers\", transformers.__version__, \"pydantic\", pydantic.__version__)'; \
lscpu; nvidia-smi topo -m; cat /sys/bus/pci/devices/*/numa_node 2>/dev/null | sort | uniq -c" ;;
  demo)   # issue 3: validate, the plan, the hardware check, and a short generation run on the GPU
    mkdir -p "$R/demo"
    stage validate 60 $F validate $H/ | tee "$R/demo/validate.txt"
    stage plan-1p5b 60 $F provision $H/node-llama-1p5b.yaml --dry-run | tee "$R/demo/provision-dry-run-1p5b.txt"
    stage plan-8b 60 $F provision $H/node-llama-8b.yaml --dry-run | tee "$R/demo/provision-dry-run-8b.txt"
    stage probe 60 python3 -c "
from forge.config.load import load_node
from forge.hardware.probe import probe_all, check_node_against_hardware
cards = probe_all()
for c in cards: print('probed:', c)
for n in ('node-llama-1p5b', 'node-llama-8b', 'node-llama-1p5b-small-pool'):
    p = check_node_against_hardware(load_node('$H/' + n + '.yaml').node, cards)
    print(n, 'matches this machine' if not p else p)" | tee "$R/demo/probe.txt"
    stage generate 240 $F run functions/summarize.py --node $H/node-llama-1p5b.yaml \
      --input functions/data/summarize.jsonl --output "$R/demo/summarize.out.jsonl" --progress lines
    ;;
  mixed-1p5b)
    stage mixed-1p5b 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --out "$R/mixed-1p5b" \
      --direct sorted,depth ;;
  prefix-1p5b)
    stage prefix-1p5b 300 $F bench run $W/gpu-prefix-heavy.yaml --node $H/node-llama-1p5b-small-pool.yaml \
      --out "$R/prefix-1p5b" --direct sorted ;;
  mixed-8b)
    stage mixed-8b 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b.yaml --records 128 \
      --out "$R/mixed-8b" --direct sorted,depth ;;
  # second call (after the prefix gate, forge/engines/hf/prefix_gate.py): direct variant depth only (call 1: best)
  mixed-1p5b-gate)
    stage mixed-1p5b-gate 200 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --out "$R/mixed-1p5b-gate" \
      --direct depth ;;
  prefix-1p5b-gate)
    stage prefix-1p5b-gate 150 $F bench run $W/gpu-prefix-heavy.yaml --node $H/node-llama-1p5b-small-pool.yaml \
      --out "$R/prefix-1p5b-gate" --modes forge,fifo ;;
  prefix-short-1p5b)
    stage prefix-short-1p5b 120 $F bench run $W/gpu-prefix-heavy-short.yaml --node $H/node-llama-1p5b-small-pool.yaml \
      --out "$R/prefix-short-1p5b" --modes forge,fifo ;;
  # third call (prefix gate removed again): the spread of the final build, two interleaved repetitions
  mixed-1p5b-repeat)
    stage mixed-1p5b-repeat 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml \
      --out "$R/mixed-1p5b-repeat" --direct depth --repeat 2 ;;
  # fourth call (admission reserves a shared prefix block once: forge/runtime/flights.py): broker vs FIFO again
  prefix-1p5b-credit)
    stage prefix-1p5b-credit 300 $F bench run $W/gpu-prefix-heavy.yaml --node $H/node-llama-1p5b-small-pool.yaml \
      --out "$R/prefix-1p5b-credit" --modes forge,fifo --repeat 2 ;;
  prefix-short-1p5b-credit)
    stage prefix-short-1p5b-credit 150 $F bench run $W/gpu-prefix-heavy-short.yaml \
      --node $H/node-llama-1p5b-small-pool.yaml --out "$R/prefix-short-1p5b-credit" --modes forge,fifo ;;
  # issue 16: the sweep over the backend's switches, budget, slots (and replicas, skipped until card workers land)
  sweep-1p5b)   # 12+ candidates in one call: 256 records each, confirm 2 x 256 interleaved, winner written
    # compile is skipped: its warm-up outlasts a candidate's limit (cut at 150 s on CPU); replicas 2 and 3
    sweep sweep-1p5b 570 h200-llama-1p5b $H/node-llama-1p5b.yaml 256 256 --skip transformers.compile_level \
      --replicas 2,3 ;;
  sweep-8b)     # smaller: no compile, no scheduler; 128 records each
    sweep sweep-8b 560 h200-llama-8b $H/node-llama-8b.yaml 128 128 --skip transformers.compile_level \
      --skip transformers.scheduler --try transformers.use_cuda_graph=true,limits.max_batch_size=256 ;;
  # issue 16, second session: the 8B's sweep with its own levers. Its step is GPU-bound where the 1.5B's is Python-
  # bound, and SDPA over the packed batch's explicit mask costs budget x (budget + cached) per step, so smaller
  # token budgets (with and without CUDA graphs) and 256 slots; 96 records per candidate, 10 candidates
  sweep-8b-budget)
    sweep sweep-8b-budget 570 h200-llama-8b $H/node-llama-8b.yaml 96 128 --tokens 2048,4096 --slots 256 \
      --replicas 2 --skip transformers.compile_level --skip transformers.scheduler \
      --skip transformers.async_batching --skip transformers.attn_implementation --combine 1 \
      --try transformers.use_cuda_graph=true,limits.max_num_tokens=4096 \
      --try transformers.use_cuda_graph=true,limits.max_num_tokens=2048 \
      --try transformers.use_cuda_graph=true,limits.max_batch_size=256 ;;
  confirm-1p5b) compare confirm-1p5b 560 "${CONFIRM_RECORDS:-512}" $H/node-llama-1p5b.yaml "$NEW_1P5B" ;;
  confirm-8b)   compare confirm-8b 560 "${CONFIRM_RECORDS_8B:-256}" $H/node-llama-8b.yaml "$NEW_8B" ;;
  confirm)      # both, one after the other (each needs most of a call at 512 records: prefer one per call)
    compare confirm-1p5b 280 "${CONFIRM_RECORDS:-256}" $H/node-llama-1p5b.yaml "$NEW_1P5B"
    compare confirm-8b 280 "${CONFIRM_RECORDS_8B:-128}" $H/node-llama-8b.yaml "$NEW_8B" ;;
  # the same commands on the embedded CPU tier (tiny model, quick workload): flags parse, children start, reports
  cpu-check)
    WL=forge/bench/quick.yaml TIERS=$R/cpu-tiers
    sweep sweep-cpu 200 tiny-llama-cpu node_descriptions/local.yaml 8 8 --set transformers.compile_level=1 \
      --skip transformers.attn_implementation --skip limits.max_batch_size \
      --try transformers.use_cuda_graph=true,transformers.compile_level=1
    compare confirm-cpu 150 8 node_descriptions/local.yaml "$R/cpu-tiers/node-tiny-llama-cpu-fast.yaml"
    WL=$W/gpu-mixed.yaml; unset TIERS ;;
  # issue 14: several cards. The CPU-scaling harness (N = 1, 2, 4, 8 CPU-bound instant cards, engines in the
  # node's process vs worker processes, 3:1 shares, control plane per transport) and two-H200 nodes.
  scaling-cpu)
    stage scaling-cpu 540 $F bench scaling --out "$R/scaling-cpu" ;;
  cards-2x1p5b)
    stage cards-2x1p5b 540 $F bench run $W/gpu-mixed.yaml --node docs/bench/h200x2/node-equal-1p5b.yaml --records 256 \
      --together-records 512 --repeats 2 --card-transport "${CARD_TRANSPORT:-process}" --out "$R/cards-2x1p5b" ;;
  cards-1p5b-8b)
    stage cards-1p5b-8b 540 $F bench run $W/gpu-mixed.yaml --node docs/bench/h200x2/node-1p5b-8b.yaml --records 256 \
      --together-records 384 --repeats 2 --card-transport "${CARD_TRANSPORT:-process}" --out "$R/cards-1p5b-8b" ;;
  # issue 17: every two-card node started from a fresh process STARTS times (default 3), one after the other; each
  # start bounded (ready within READY_TIMEOUT s, exit within 120 s of SIGTERM); starts.json/starts.md kept per start
  starts-2card)
    stage starts-2card 560 python3 docs/bench/fresh_starts.py docs/bench/h200x2/node-equal-1p5b.yaml \
      docs/bench/h200x2/node-1p5b-8b.yaml --starts "${STARTS:-3}" --ready-timeout "${READY_TIMEOUT:-150}" \
      --out "$R/starts-2card" ;;
  # issue 14 (every card in its own worker process): forge ÷ direct on one H200, three interleaved repeats, the
  # default (process) transport; then the same with the card's engine in the node's own process (the before)
  mixed-1p5b-process)
    stage mixed-1p5b-process 420 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 \
      --out "$R/mixed-1p5b-process" --direct depth --repeat 3 --card-transport process ;;
  mixed-1p5b-thread)
    stage mixed-1p5b-thread 300 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 \
      --out "$R/mixed-1p5b-thread" --direct depth --repeat 2 --card-transport thread ;;
  # issue 14, one call with the 16-core scaling below: forge ÷ direct only (no FIFO), three interleaved repeats
  mixed-1p5b-df)
    stage mixed-1p5b-df 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 \
      --out "$R/mixed-1p5b-df" --modes direct,forge --direct depth --repeat 3 --card-transport process ;;
  # issue 14, the last call (after docs/benchmarks.md "Closing forge ÷ direct"): forge ÷ direct, three interleaved
  # repeats, worker process. 512 records need ~310 s here (each forge run spawns its worker and builds the 1.5B,
  # ~20 s); within the 270 s this stage may take, FINAL_RECORDS defaults to 384 (FINAL_RECORDS=512 FINAL_LIMIT=330
  # for the issue's exact size when the call has room).
  final-1p5b-df)
    stage final-1p5b-df "${FINAL_LIMIT:-270}" $F bench run $W/gpu-mixed.yaml --node "${FINAL_NODE:-$H/node-llama-1p5b.yaml}" \
      --records "${FINAL_RECORDS:-384}" --out "$R/final-1p5b-df" --modes direct,forge --direct depth --repeat 3 \
      --card-transport process ;;
  scaling-cpu-1)   # the scaling harness, one repeat (fits beside mixed-1p5b-df in one call)
    stage scaling-cpu-1 240 $F bench scaling --repeat 1 --out "$R/scaling-cpu" ;;
  # issue 14, shares at 3:1 after the bias-corrected speed EWMA (docs/benchmarks.md "Shares at 3:1"): the 3:1 cell
  # (with N = 1 beside it, which the harness always runs), worker processes, three interleaved repeats; then the
  # same with 2,400 records a card (a together window of ~11 s, two half-lives of the speed EWMA)
  scaling-3to1)
    stage scaling-3to1 200 $F bench scaling --cards 1 --transports process --repeat 3 --control-plane-records 1000 \
      --out "$R/scaling-3to1" ;;
  scaling-3to1-long)
    stage scaling-3to1-long 300 $F bench scaling --cards 1 --transports process --repeat 2 --records 2400 \
      --control-plane-records 1000 --out "$R/scaling-3to1-long" ;;
  # issue 14 + 16, second session: where forge's step time goes on the fast 1.5B tier (CUDA graphs), direct vs
  # forge (and FIFO) with the engine's steps and ms/step in the report; then the same pair under two experiments put
  # on PYTHONPATH as sitecustomize (docs/bench/h200/exp/): a 0.5 ms GIL switch interval in every process, and a
  # quiet driver thread (~20 wake-ups/s instead of ~200); then one pair under py-spy (--gil, per thread); then
  # the control plane on 50,000 tasks (node pinned to core 0), as measured on the development machine
  df-fast-fifo)
    stage df-fast-fifo 230 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b-fast.yaml --records 512 \
      --out "$R/df-fast-fifo" --modes direct,forge,fifo --direct depth --repeat 2 --card-transport process ;;
  df-fast-switch)
    stage df-fast-switch 150 env PYTHONPATH="$PWD/$H/exp/switch-500us:$PYTHONPATH" $F bench run $W/gpu-mixed.yaml \
      --node $H/node-llama-1p5b-fast.yaml --records 512 --out "$R/df-fast-switch" --modes direct,forge \
      --direct depth --repeat 2 --card-transport process ;;
  df-fast-quiet)
    stage df-fast-quiet 90 env PYTHONPATH="$PWD/$H/exp/quiet-driver:$PYTHONPATH" $F bench run $W/gpu-mixed.yaml \
      --node $H/node-llama-1p5b-fast.yaml --records 512 --out "$R/df-fast-quiet" --modes direct,forge \
      --direct depth --repeat 1 --card-transport process ;;
  df-fast-spy)
    mkdir -p "$R/df-fast-spy"
    stage df-fast-spy 100 /tmp/site/bin/py-spy record --gil --threads --subprocesses --format raw --rate 100 \
      -o "$R/df-fast-spy/gil.txt" -- $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b-fast.yaml \
      --records 384 --out "$R/df-fast-spy" --modes direct,forge --direct depth --repeat 1 --card-transport process ;;
  # longest first across groups (call J): forge's steps equal direct longest's, each slower; where the worker's
  # time goes, beside direct longest's loop (one repeat, shipped 1.5B)
  lpt-spy)
    mkdir -p "$R/lpt-spy"
    stage lpt-spy 200 /tmp/site/bin/py-spy record --gil --threads --subprocesses --format raw --rate 100 \
      -o "$R/lpt-spy/gil.txt" -- $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml \
      --records 512 --out "$R/lpt-spy" --modes direct,forge --direct longest --repeat 1 --card-transport process ;;
  # the broker's grouped queues serve the longest requested output first (forge/broker/pending.py): forge, FIFO
  # and direct (arrival order, and the whole workload longest first) on the shipped 1.5B tier, 2 interleaved repeats
  lpt-1p5b)
    stage lpt-1p5b 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 \
      --out "$R/lpt-1p5b" --modes direct,forge,fifo --direct depth,longest --repeat 2 --card-transport process ;;
  # next: issue 14's exact size (three repeats) with longest first, and the same on the fast tier (issue 16)
  lpt-1p5b-3)
    stage lpt-1p5b-3 420 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 \
      --out "$R/lpt-1p5b-3" --modes direct,forge --direct depth,longest --repeat 3 --card-transport process ;;
  lpt-fast-3)
    stage lpt-fast-3 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b-fast.yaml --records 512 \
      --out "$R/lpt-fast-3" --modes direct,forge --direct depth,longest --repeat 3 --card-transport process ;;
  # issue 16's "12+ candidates in one 10-minute call" on the 1.5B. Run once at 128 records (12:11 UTC, call I): 10
  # ran in 490 s, 4 cut, the confirm's reserve ~60 s too large. Now 96 records a candidate (the confirm keeps 128)
  # and the reserve from each tier's load + window (forge/bench/sweep.py, confirm_reserve); call with DEADLINE=595
  sweep-1p5b-12)
    sweep sweep-1p5b-12 585 h200-llama-1p5b $H/node-llama-1p5b.yaml 96 128 --skip transformers.compile_level \
      --replicas 2,3 --combine 1 --try transformers.use_cuda_graph=true,card.replicas=2 \
      --try transformers.use_cuda_graph=true,limits.max_batch_size=256 \
      --try transformers.use_cuda_graph=true,limits.max_num_tokens=4096 ;;
  # Where a step's time goes (docs/benchmarks.md, "The fourth session on the H200"): issue 14's measurement (three
  # interleaved repeats, direct fed longest first) with transformers' loop timed from inside in every process
  # (exp/steptime; summary: docs/bench/steplog_summary.py), then the same with the quiet driver as well
  lpt-steps-3) timed_1p5b lpt-steps-3 330 steptime --repeat 3 ;;
  lpt-quiet-2) timed_1p5b lpt-quiet-2 220 steptime-quiet --repeat 2 ;;
  # issue 16: forge ÷ direct on the 8B fast tier (the sweep's winner: CUDA graphs, token budget 2,048), direct fed
  # longest first, 256 records, three interleaved repeats
  lpt-8b-fast-3)
    stage lpt-8b-fast-3 450 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b-fast.yaml --records 256 \
      --out "$R/lpt-8b-fast-3" --modes direct,forge --direct longest --repeat 3 --card-transport process ;;
  # the same with the engine holding 8 requests beyond its slots instead of 128 (transformers.max_waiting: 8)
  lpt-8b-w8-2)
    stage lpt-8b-w8-2 300 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b-fast-w8.yaml --records 256 \
      --out "$R/lpt-8b-w8-2" --modes direct,forge --direct longest --repeat 2 --card-transport process ;;
  # where the 8B fast tier's gap is: forge grouped, forge FIFO (grouping off) and direct, one repeat
  fifo-8b-fast)
    stage fifo-8b-fast 200 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b-fast.yaml --records 256 \
      --out "$R/fifo-8b-fast" --modes direct,fifo,forge --direct depth,longest --repeat 1 --card-transport process ;;
  # next (not run yet): the broker with output classes of a quarter of a power of two (the patch is applied to the
  # device's copy of the tree for this stage only) against the shipped broker, on the 8B fast tier where forge took
  # 138-143 steps against direct's 133; the CPU proxy's replay says quarters take exact-length order's steps
  # (docs/benchmarks.md, "The 8B's extra steps on the CPU proxy"). Then the same with 16 requests of headroom.
  quarters-8b)
    patch_tree docs/bench/cpu-proxy/exp/quarter-classes.patch || { echo "=== quarters-8b: patch does not apply"; continue; }
    stage quarters-8b 330 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b-fast.yaml --records 256 \
      --out "$R/quarters-8b" --modes direct,forge --direct longest --repeat 3 --card-transport process
    patch_tree -R docs/bench/cpu-proxy/exp/quarter-classes.patch ;;
  quarters-headroom-8b)
    patch_tree docs/bench/cpu-proxy/exp/quarter-classes.patch || { echo "=== quarters-headroom-8b: patch does not apply"; continue; }
    stage quarters-headroom-8b 330 env HEADROOM=16 PYTHONPATH="$PWD/docs/bench/cpu-proxy/exp/headroom:$PYTHONPATH" \
      $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b-fast.yaml --records 256 \
      --out "$R/quarters-headroom-8b" --modes direct,forge --direct longest --repeat 3 --card-transport process
    patch_tree -R docs/bench/cpu-proxy/exp/quarter-classes.patch ;;
  # next (not run yet): issue 14's measurement with a worker that has run a whole job of other records first
  # (--warm-jobs 1), and the step timer cut to each window
  warm-1p5b-3) timed_1p5b warm-1p5b-3 450 steptime-threads --repeat 3 --warm-jobs 1 ;;
  warm-1p5b-2) timed_1p5b warm-1p5b-2 330 steptime-threads --repeat 2 --warm-jobs 1 ;;
  # the product path as it is (cold worker), the step timer and every thread's CPU in every process
  lpt-threads-3) timed_1p5b lpt-threads-3 330 steptime-threads --repeat 3 ;;
  lpt-threads-3b) timed_1p5b lpt-threads-3b 330 steptime-threads --repeat 3 ;;   # a second set in the same call
  # next (not run yet): direct in a fresh process of its own per run (--direct-process child), as forge's card
  # worker is: tells "a fresh process" from "forge's worker" in the per-step gap (docs/benchmarks.md, calls S-U)
  lpt-child-3) timed_1p5b lpt-child-3 400 steptime-threads --repeat 3 --direct-process child ;;
  lpt-8b-child-3)
    stage lpt-8b-child-3 450 $F bench run $W/gpu-mixed.yaml --node $H/node-llama-8b-fast.yaml --records 256 \
      --out "$R/lpt-8b-child-3" --modes direct,forge --direct longest --repeat 3 --card-transport process \
      --direct-process child ;;
  # does Python in a sibling thread of the engine's process cost transformers' loop what forge's worker loses?
  # direct only, each run in its own process, alternating plain / NOISE_MS of Python per finished result (exp/sibling-noise)
  noise-1p5b-6)
    mkdir -p "$R/noise-1p5b-6/steplog" "$R/noise-1p5b-6/threadlog"
    stage noise-1p5b-6 330 env STEPLOG="$R/noise-1p5b-6/steplog" THREADLOG="$R/noise-1p5b-6/threadlog" \
      NOISE_DIR="$R/noise-1p5b-6/noise" NOISE_PATTERN=PNNPPN NOISE_MS="${NOISE_MS:-2.5}" \
      PYTHONPATH="$PWD/$H/exp/sibling-noise:$PYTHONPATH" \
      $F bench run $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --records 512 --out "$R/noise-1p5b-6" \
      --modes direct --direct longest --repeat 6 --direct-process child
    ls "$R/noise-1p5b-6/noise"
    python3 docs/bench/steplog_summary.py "$R/noise-1p5b-6/steplog" "$R/noise-1p5b-6/bench.json" | tee "$R/noise-1p5b-6/steplog.md"
    python3 docs/bench/threadcpu_summary.py "$R/noise-1p5b-6/threadlog" "$R/noise-1p5b-6/bench.json" > "$R/noise-1p5b-6/threadcpu.md"
    pack ;;
  # forge's schedule at the direct mode's cost per step: one bench (direct longest, forge; 2 repeats) recording what
  # entered the scheduler at which step (exp/timeline), then each recorded timeline of the first repeat replayed on a
  # fresh engine without forge (replay_timeline.py), forge's and direct's alternating, twice
  timeline-1p5b) timeline timeline-1p5b 260 80 $H/node-llama-1p5b.yaml 512 2 ;;
  # the same for the 8B fast tier (CUDA graphs; 256 records): is its larger gap (forge's steps 190-220 ms against
  # direct's 174-179, GPU utilisation 71-79 % against 82-91 %, call U) the schedule or forge's worker?
  timeline-8b) timeline timeline-8b 200 90 $H/node-llama-8b-fast.yaml 256 1 ;;
  # both engines warm (one whole job of other records first), three interleaved repeats: the 8B fast tier (256
  # records, as in calls P and U) and the 1.5B fast tier (512, as in call O)
  warm-8b-3) warm_pair warm-8b-3 460 $NEW_8B 256 3 ;;
  warm-1p5b-fast-3) warm_pair warm-1p5b-fast-3 400 $NEW_1P5B 512 3 ;;
  # two warm jobs each (call AA: after one, 8 captures in direct's window and 15 in forge's, still 2.2 and 4.3 s)
  warm2-8b-3) warm_pair warm2-8b-3 540 $NEW_8B 256 3 2 ;;
  # next (not run yet): cold engines, forge's card workers capturing at load the 72 shapes calls Z-AB met
  # (exp/precapture; an oracle of the shapes, so an upper bound of what remembering a tier's shapes would give);
  # then every engine, direct's too (PRECAPTURE_IN=python: every process), which leaves only the schedule between them
  # next (not run yet): query padding 64 (the fast tier) against 128 (graph_q_padding), cold engines, forge and
  # direct, 2 interleaved repeats: fewer graph captures against more padded tokens in every step
  pad-8b)
    stage pad-8b 450 $F bench compare $W/gpu-mixed.yaml --node "$NEW_8B" --label q64 \
      --node $H/node-llama-8b-fast-q128.yaml --label q128 --modes forge,direct --repeat 2 --records 256 --out "$R/pad-8b" ;;
  precapture-8b) precap precapture-8b 330 forge.host "$NEW_8B" 256 docs/bench/captures/2026-12-01-h200 ;;
  precapture-all-8b) precap precapture-all-8b 330 python "$NEW_8B" 256 docs/bench/captures/2026-12-01-h200 ;;
  # the same on the 1.5B fast tier, where both modes spent a third of every window capturing graphs even after a warm
  # job (call AE): its shapes from call AE's capture logs (forge's workers only, then every engine)
  precapture-1p5b-fast) precap precapture-1p5b-fast 420 forge.host "$NEW_1P5B" 512 \
    docs/bench/captures/2026-12-02-h200/call-ae ;;
  precapture-all-1p5b-fast) precap precapture-all-1p5b-fast 420 python "$NEW_1P5B" 512 \
    docs/bench/captures/2026-12-02-h200/call-ae ;;
  # tenth session: the fast tiers' graph_shape_cache (the product path of exp/precapture), cold, both modes
  # (call AI: each load captures 153 shapes in 25-38 s, so 3 repeats of the 1.5B did not fit 345 s)
  cached-1p5b-fast) cached cached-1p5b-fast 420 "$NEW_1P5B" 512 3 ;;
  cached-8b-2) cached cached-8b-2 300 "$NEW_8B" 256 2 ;;
  cached-8b-3) cached cached-8b-3 420 "$NEW_8B" 256 3 ;;
  # recorded timelines replayed on the 1.5B without forge (replay_timeline.py), in the order REPLAYS names them:
  # $REPLAY_DIR/in.pickle (a direct run's input from a --direct-process child bench of this tier) and NAME.jsonl each
  # (carried: the device has no copy; docs/benchmarks.md, "The sixth session on the H200", says how they were made)
  replays)
    d="$R/replays"; mkdir -p "$d/steplog"; RD=${REPLAY_DIR:-.replay}; i=0
    for name in ${REPLAYS:-}; do
      i=$((i + 1))
      stage "replay-$i-$name" 75 env STEPLOG="$d/steplog" PYTHONPATH="$PWD/$H/exp/timeline:$PYTHONPATH" \
        python3 docs/bench/h200/replay_timeline.py "$RD/in.pickle" "$RD/$name.jsonl" 512 "$d/replay-$i-$name.json"
    done
    pack ;;
  # the same with the wake-on-command patch in the tree for this stage (the worker's driver: 0.9 % of the window's
  # CPU instead of 2.8-3.7 % on the CPU proxy)
  lpt-wake-3)
    patch_tree docs/bench/h200/exp/wake-on-command.patch || { echo "=== lpt-wake-3: patch does not apply"; continue; }
    timed_1p5b lpt-wake-3 330 steptime-threads --repeat 3
    patch_tree -R docs/bench/h200/exp/wake-on-command.patch ;;
  cp50k)
    stage cp50k 90 $F bench control-plane --records 50000 --repeat 3 --out "$R/cp50k" ;;
  # issue 16, the last call: the new tiers (the sweep's CUDA graphs; replicas 2) against the shipped ones through
  # forge, interleaved in one process
  final-8b)
    stage final-8b 240 $F bench compare $W/gpu-mixed.yaml --node $H/node-llama-8b.yaml --label shipped \
      --node $H/node-llama-8b-fast-r2.yaml --label graphs-r2 --modes forge --repeat 2 --records 128 \
      --out "$R/final-8b" ;;
  final-1p5b-r2)
    stage final-1p5b-r2 200 $F bench compare $W/gpu-mixed.yaml --node $H/node-llama-1p5b.yaml --label shipped \
      --node $H/node-llama-1p5b-fast-r2.yaml --label graphs-r2 --modes forge --repeat 2 --records 256 \
      --out "$R/final-1p5b-r2" ;;
  # next (not run yet; eighth session): the one-engine broker's output classes, 32 to a power of two (shipped since
  # 2026-12-02) against the power of two (exp/class-bits, CLASS_BITS=0), alternating invocations A B A B, each
  # direct longest then forge: issue 14's measurement (shipped 1.5B tier, 512 records, cold) and the 8B fast tier
  # warm (256 records, --warm-jobs 2, as call AB). CPU proxies: 1.5B 247 -> 242 steps, 8B 141 -> 134 (direct 243, 133).
  classes-1p5b) classes classes-1p5b 130 $H/node-llama-1p5b.yaml 512 0 ;;
  classes-8b-warm) classes classes-8b-warm 140 $NEW_8B 256 2 ;;
  *) echo "unknown stage $s" ;;
esac; done
pack
echo "=== summary"
for f in "$R"/*/control-plane.md; do [ -f "$f" ] && { echo "--- $f"; grep "^|" "$f"; }; done
for f in "$R"/*/bench.md "$R"/*/sweep.md "$R"/*/compare.md; do
  [ -f "$f" ] && { echo "--- $f"; grep -A3 "^| forge ÷\|^\*\*Best\|^\*\*Winner\|^Confirm\|^| tier" "$f"; }; done
for f in "$R"/cards-*/bench.md; do [ -f "$f" ] && { echo "--- $f"; grep -A1 "^together ÷ Σ alone" "$f"; }; done
for f in "$R"/starts-*/starts.md; do [ -f "$f" ] && { echo "--- $f"; grep "start(s) healthy" "$f"; }; done
for f in "$R"/scaling-*/scaling.md; do [ -f "$f" ] && { echo "--- $f"; sed -n '/^## Equal/,$p' "$f"; }; done
true   # the call succeeded when it got here; each stage reports its own rc above
