"""Check, on CPU, that the precapture experiment's fake batch lands on the graph key it is meant for.

    OMP_NUM_THREADS=1 python docs/bench/h200/exp/precapture/check_keys.py NODE.yaml CAPTURE_LOGS

Builds NODE's one card as the direct mode does (transformers' own API), turns on the runner's input padding and the
IO's CUDA-graph key padding (no graph is captured on CPU), prepares one fake batch per recorded shape with
sitecustomize.capture_shape and compares the key transformers computes for it with the recorded one; then runs one
such batch through compute_batch (a plain forward here). 2026-12-01: every one of the 45 shapes of call Z's logs
(docs/bench/captures/2026-12-01-h200/call-z/timeline-8b/timeline) on docs/bench/cpu-proxy/node-cpu-llama-micro-g1p5b.yaml
(the same budget and pool as the 8B tier's keys need) matched."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(node: str, logs: str) -> None:
    ns = runpy.run_path(str(HERE / "sitecustomize.py"))
    from forge.bench.direct import DirectEngine
    from forge.config.load import load_node

    eng = DirectEngine(load_node(node).plans[0])
    runner = eng.manager().batch_processor.model_runner
    runner.pad_inputs = True
    runner.inputs_and_outputs.use_cuda_graph_varlen = True
    ok = bad = skipped = 0
    for key in ns["shapes_from"](logs):
        if key[0] > runner.cache.max_batch_tokens or key[1] > runner.cache.max_tokens_read:
            skipped += 1
            continue
        got = ns["capture_shape"](runner, eng.model, key, force_key_only=True)
        if got is None:
            skipped += 1
        elif tuple(got) == tuple(key):
            ok += 1
        else:
            bad += 1
            print(f"mismatch: wanted {key}, got {got}")
    ran = ns["capture_shape"](runner, eng.model, (128, 16384, 2048))
    print(f"{ok} matched, {bad} did not, {skipped} skipped (beyond this tier's sizes, or no room); "
          f"one batch through compute_batch: key {ran}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: check_keys.py NODE.yaml CAPTURE_LOGS")
    main(*sys.argv[1:3])
