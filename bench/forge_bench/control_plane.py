"""`forge bench control-plane`: forge's own ceiling in tasks/s. The full forge path — records read,
one function invocation per record, broker, admission, dispatch to the engine's driver thread,
results back, ledger (SQLite, durable commits) and the output file — with the `instant` engine,
which answers at once and runs NO MODEL. It measures forge, not an engine; every report of it says
so.

The node's process is pinned to one CPU core (all of its threads: the event loop, the ledger's
committer, and with --card-transport thread the engine's driver), so the figure is "per core"; with
worker processes (the default) the card's worker runs on the other cores, and what is counted is the
node process's CPU time."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from forge.config.load import LoadedDescription
from forge.config.models import Contract, NodeDescription
from forge.config.plan import plan_card
from forge.errors import UsageError
from forge_bench.forge_mode import run_forge, write_records
from forge_bench.report import header, write_report
from forge_bench.workload import BenchRequest
from forge_bench.engines.instant import LABEL

PROMPT_TOKENS = 8
NEW_TOKENS = 1
TARGET_TASKS_PER_S = 20_000


def instant_node(slots: int = 1024) -> LoadedDescription:
    """One cpu card with an instant engine (no model); the embedded tokenizer decodes its synthetic
    output."""
    from forge.embedded import TINY_MODEL_DIR

    c = Contract.model_validate(
        dict(
            contract="instant-control-plane",
            backend="instant",
            model=dict(
                architecture="LlamaForCausalLM",
                num_layers=4,
                num_kv_heads=4,
                head_dim=32,
                vocab_size=2048,
                weights_gib=0.0,
            ),
            artifact=dict(checkpoint=str(TINY_MODEL_DIR)),
            precision=dict(weights="fp32", kv_cache="fp32"),
            limits=dict(
                max_batch_size=slots, max_num_tokens=slots * 64, max_input_len=64, max_output_len=16
            ),
            kv_cache=dict(
                tokens_per_block=16, max_tokens=slots * 80, host_cache_size=0, block_reuse=True
            ),
            target=dict(kind="cpu"),
        )
    )
    node = NodeDescription.model_validate(
        dict(
            node="control-plane",
            contracts=[],
            host=dict(memory_gib=1, cpu_cores=1),
            cards=[dict(index=0, kind="cpu", model="cpu", memory_gib=1, engine=c.contract)],
            metrics=dict(port=0),
        )
    )
    return LoadedDescription(
        node=node, contracts={c.contract: c}, plans=[plan_card(node.cards[0], c)], warnings=[]
    )


def pin_to_core(core: Optional[int]) -> tuple[Optional[int], Optional[frozenset[int]]]:
    """Pin this process to `core`; returns it and the cores left for worker processes (None: not
    pinned)."""
    if core is None:
        return None, None
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:
        raise UsageError("--cpu: this platform cannot pin a process to a core") from None
    if core not in allowed:
        raise UsageError(f"--cpu {core}: this process may use cores {sorted(allowed)}")
    os.sched_setaffinity(0, {core})
    return core, frozenset(allowed - {core}) or frozenset(allowed)


def run_control_plane(workdir: Path, *, records: int, core: Optional[int], repeat: int = 1,
                      slots: int = 1024, card_transport: str = "process") -> dict:
    pinned, worker_cpus = pin_to_core(core)
    loaded = instant_node(slots)
    reqs = [
        BenchRequest(
            index=i,
            prompt=tuple(3 + (i * 7 + j) % 2000 for j in range(PROMPT_TOKENS)),
            max_new_tokens=NEW_TOKENS,
        )
        for i in range(records)
    ]
    path = write_records(reqs, workdir / "control-plane.records.jsonl")
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        r = run_forge(loaded, path, records, workdir, grouping=True, label="control-plane",
                      card_transport=card_transport, worker_cpus=worker_cpus)
        r.variant = "instant (no model)"
        d = r.to_dict()
        d["wall_s"] = round(time.perf_counter() - started, 3)
        runs.append(d)
    top = max(runs, key=lambda d: d["requests_per_s"])
    per_cpu = max((d.get("requests_per_cpu_s") or 0.0) for d in runs)
    return {
        "label": LABEL,
        "records": records,
        "pinned_core": pinned,
        "slots": slots,
        "card_transport": card_transport,
        "worker_cpus": sorted(worker_cpus) if worker_cpus else None,
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
        "runs": runs,
        "best_tasks_per_s": top["requests_per_s"],
        "best_tasks_per_cpu_s": per_cpu,
        "target_tasks_per_s": TARGET_TASKS_PER_S,
        "meets_target": top["requests_per_s"] >= TARGET_TASKS_PER_S and top["completed"] == records,
    }


def control_plane_markdown(data: dict) -> str:
    cp = data["control_plane"]
    lines = header("forge bench control-plane: forge's own ceiling", data["env"],
                   label=f"{cp['label']}. This measures forge, not an engine.")
    core = (
        f"pinned to CPU core {cp['pinned_core']}" if cp["pinned_core"] is not None else "not pinned"
    )
    where = (
        "in its worker process"
        + (f" on cores {cp['worker_cpus']}" if cp.get("worker_cpus") else "")
        if cp.get("card_transport", "process") == "process"
        else "in the node's process (--card-transport thread)"
    )
    lines += [f"{cp['records']:,} records, {cp['prompt_tokens']} prompt token ids and "
              f"{cp['new_tokens']} new token "
              "each, through records → functions → broker → admission → engine driver → results → "
              "ledger "
              f"(SQLite) → output JSONL; node process {core}; the card's engine {where}; "
              f"{cp['slots']} slots.", "",
              f"**Best: {cp['best_tasks_per_s']:,.0f} tasks/s** wall-clock (target "
              f"{cp['target_tasks_per_s']:,}: "
              f"{'met' if cp['meets_target'] else 'NOT met'}); {cp['best_tasks_per_cpu_s']:,.0f} "
              "tasks per CPU-second "
              "of this process (what one core would do alone: on a shared machine the wall-clock "
              "figure also "
              "counts time other processes held the core).", "",
              "| run | done | window s | CPU s | tasks/s | tasks per CPU-s |", "| ---: | --- | "
                                                                               "---: | ---: | ---: "
                                                                               "| ---: |"]
    for i, r in enumerate(cp["runs"], 1):
        lines.append(f"| {i} | {r['completed']}/{r['requests']} | {r['window_s']:.3f} | "
                     f"{r.get('cpu_s') or 0:.3f} | "
                     f"{r['requests_per_s']:,.0f} | {r.get('requests_per_cpu_s') or 0:,.0f} |")
    lines.append("")
    return "\n".join(lines)


def write_control_plane(out: Path, data: dict) -> list[Path]:
    return write_report(out, "control-plane", data, control_plane_markdown(data))
