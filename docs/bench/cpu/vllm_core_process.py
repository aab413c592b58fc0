"""vLLM's own API (`LLM.generate`) on the embedded vLLM tier, its engine core in this process or in a process of its
own: the figure beside "forge ÷ vLLM" in docs/benchmarks.md ("vLLM on the CPU"). Not a forge mode: forge runs the
core in its card worker (forge/engines/vllm/engine.py says why), and this asks what a core process would be worth.

    python docs/bench/cpu/vllm_core_process.py in    # in process, bound to core 1 (as forge's direct mode)
    python docs/bench/cpu/vllm_core_process.py mp    # core process on core 1 (VLLM_CPU_OMP_THREADS_BIND), this one on 0

Run from the repository root; three windows of the 1,536-record cpu-mixed-short workload, each from an empty prefix
cache, the engine arguments forge passes (forge/engines/vllm/mapping.py)."""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path


def main() -> None:
    from forge_bench.workload import generate, load_workload
    from forge.config.load import load_node
    from forge.engines.vllm import mapping

    mode = sys.argv[1] if len(sys.argv) > 1 else "in"
    plan = load_node(Path("node_descriptions/local-vllm.yaml")).plans[0]
    args = mapping.engine_arguments(plan.contract, plan)
    mapping.apply_environment(os.environ)
    if mode == "mp":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "1"
        os.sched_setaffinity(0, {0})
    else:
        os.sched_setaffinity(0, {1})
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    taken = {f.name for f in dataclasses.fields(EngineArgs)}
    llm = LLM(**{k: v for k, v in args.items() if k in taken})
    reqs = generate(load_workload(Path("docs/bench/workloads/cpu-mixed-short.yaml")), plan.contract.model.vocab_size,
                    1536)
    for rep in range(3):
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": list(r.prompt)} for r in reqs],
                            [SamplingParams(temperature=0.0, max_tokens=r.max_new_tokens, detokenize=False)
                             for r in reqs], use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = sum(len(r.prompt) for r in reqs) + sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"{mode} window {rep + 1}: {dt:.2f} s, {tokens / dt:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
