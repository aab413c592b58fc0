"""Does an idle logits processor cost the engine's loop? transformers' own API fed longest first at 128 deep (the
bench's `direct longest:128`), with and without forge's guide processor installed (forge's transformers factory
installs it on every eager tier, so that guided requests can run; installing it turns on transformers' per-step
logits processing even when no request is guided), alternating, each with a fresh manager:

    OMP_NUM_THREADS=1 python docs/bench/cpu-proxy/processors_ab.py WORKLOAD NODE RECORDS REPEATS

Prints per run: window, engine steps, the generation thread's CPU seconds (from /proc) and per step."""
from __future__ import annotations

import os
import sys

from forge.bench.direct import DirectEngine, _feed
from ab_setup import arms, direct_setup


def thread_cpu(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(eng: DirectEngine, reqs, warm, guides: bool) -> str:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    m = eng.model.init_continuous_batching(generation_config=GenerationConfig(**eng.gen_kwargs),
                                           continuous_batching_config=ContinuousBatchingConfig(**eng.cb_kwargs))
    if guides:
        from forge.engines.hf.guided import install

        install(m, None, eng.plan.contract.model.vocab_size, sorted(eng.eos_set))
    m.warmup()
    m.start()
    try:
        _feed(m, list(warm), None, eng, "warm")
        tid = m._generation_thread.native_id
        s0, c0 = m.current_batch, thread_cpu(tid)
        res = _feed(m, sorted(reqs, key=lambda r: -r.max_new_tokens), 128, eng, "r")
        steps, cpu = m.current_batch - s0, thread_cpu(tid) - c0
        return (f"{'guides' if guides else 'plain':6}  window {res.window_s:6.2f} s  steps {steps}  "
                f"loop CPU {cpu:6.2f} s  {1000 * cpu / steps:6.2f} ms/step  done {res.completed}")
    finally:
        m.stop(block=True, timeout=30, hard_stop=True)
        m.destroy()


def main(workload: str, node: str, records: str, repeats: str) -> None:
    eng, reqs, warm = direct_setup(workload, node, records)
    for i in range(int(repeats)):
        for guides in arms(i):
            print(f"repeat {i + 1}  {run(eng, reqs, warm, guides)}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
