"""`forge bench`: measured throughput, side by side (docs/benchmarks.md says how to read the reports).

    forge bench run WORKLOAD.yaml      direct engine vs forge vs forge with FIFO, same engine, same work
    forge bench sweep CONTRACT         the engine-tier sweep (token budget x slots) around a contract
    forge bench control-plane          forge's own ceiling in tasks/s with the instant engine (no model)
    forge bench quick                  all three, small, on the embedded CPU node (CI)"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import click


QUICK_RECORDS = 32
QUICK_CONTROL_PLANE_RECORDS = 3000
QUICK_WORKLOAD = Path(__file__).resolve().parents[1] / "bench" / "quick.yaml"     # package data


def _say(line: str) -> None:
    click.echo(f"forge bench: {line}", err=True)


def _node(node: Optional[str]):
    from forge.cli.node_arg import description_path
    from forge.config.load import load_node

    loaded = load_node(description_path(None if node is None else str(node), "bench"))
    for w in loaded.warnings:
        click.echo(w.render(), err=True)
    return loaded


def _quiet_engines() -> None:
    """transformers logs per-request warnings at scale; the bench prints its own lines."""
    for name in ("transformers", "transformers.generation"):
        logging.getLogger(name).setLevel(logging.ERROR)


def do_run(workload: Path, node_path: Optional[Path], out: Path, modes: str, direct: str, records: Optional[int],
           warmup: int, repeat: int, concurrency: Optional[int]) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.direct import parse_variants
    from forge.bench.modes import BenchPlan, ratios, run_modes, single_card
    from forge.bench.report import card_info, write_bench
    from forge.bench.workload import load_workload, summary

    _quiet_engines()
    spec = load_workload(workload)
    loaded = _node(node_path)
    plan = single_card(loaded)
    started = envmod.describe()["date"]

    def report(requests, results) -> list[Path]:    # rewritten after every run: a cut-off bench keeps its runs
        env = dict(envmod.describe(), date=started)   # described once torch is loaded (GPUs, versions)
        data = {"kind": "forge-bench", "env": env, "card": card_info(plan),
                "workload": {"file": str(workload), "spec": spec.model_dump(), "summary": summary(requests)},
                "results": [r.to_dict() for r in results], "ratios": ratios(results)}
        return write_bench(out, data)

    bp = BenchPlan(loaded=loaded, spec=spec, workdir=out / "work", records=records, warmup=warmup, repeat=repeat,
                   modes=[m.strip() for m in modes.split(",") if m.strip()], concurrency=concurrency,
                   direct_variants=parse_variants(direct, plan.contract.limits.max_batch_size), progress=_say,
                   on_result=report)
    requests, results = run_modes(bp)
    return report(requests, results)


def do_sweep(contract: str, workload: Path, node_path: Optional[Path], out: Path, tokens: Optional[str],
             slots: Optional[str], mode: str, direct: str, records: Optional[int], warmup: int) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.sweep import contract_name, parse_ints, plan_of, run_sweep, write_sweep
    from forge.bench.workload import generate, load_workload, summary

    _quiet_engines()
    spec = load_workload(workload)
    loaded = _node(node_path)
    name = contract_name(contract)
    work = {"file": str(workload), "spec": spec.model_dump(),
            "summary": summary(generate(spec, plan_of(loaded, name).contract.model.vocab_size, records))}
    started = envmod.describe()["date"]

    def report(summ: dict, tiers: list[dict]) -> list[Path]:     # rewritten after every tier
        data = {"kind": "forge-bench-sweep", "env": dict(envmod.describe(), date=started), "summary": summ,
                "tiers": tiers, "workload": work}
        return write_sweep(out, data)

    summ, tiers = run_sweep(loaded, name, spec, out / "work", tokens=parse_ints(tokens, "--tokens"),
                            slots=parse_ints(slots, "--slots"), mode=mode, direct_variant=direct, records=records,
                            warmup=warmup, progress=_say, on_tier=report)
    return report(summ, tiers)


def do_control_plane(out: Path, records: int, cpu: Optional[int], repeat: int) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.control_plane import run_control_plane, write_control_plane

    cp = run_control_plane(out / "work", records=records, core=cpu, repeat=repeat)
    return write_control_plane(out, {"kind": "forge-bench-control-plane", "env": envmod.describe(load_torch=False),
                                     "control_plane": cp})


def _report(paths: list[Path]) -> None:
    _say("wrote " + ", ".join(str(p) for p in paths))
    md = next((p for p in paths if p.suffix == ".md"), None)
    if md is not None:
        click.echo(md.read_text(encoding="utf-8"))


def _common_run(f):
    opts = [
        click.option("--node", "node_path", default=None, metavar="NODE",
                     help="the node to provision in this process, with ONE card: a node description (NODE.yaml) or "
                     "the name of one shipped with forge; default: local, the embedded CPU node"),
        click.option("--records", type=click.IntRange(1, 1_000_000), default=None,
                     help="use this many of the workload's records (default: the file's count)"),
        click.option("--warmup", type=click.IntRange(0, 1024), default=8, show_default=True,
                     help="warm-up requests before each window (own prompts, no shared prefix)"),
        click.option("--direct", default="sorted,depth", show_default=True,
                     help="direct variants: all | sorted | depth (= slots) | depth:N, comma-separated"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def register(cli: click.Group) -> None:
    @cli.group("bench")
    def bench() -> None:
        """Measure throughput: direct engine vs forge vs FIFO, tier sweeps, forge's control-plane ceiling."""

    @bench.command("run")
    @click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @_common_run
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True, help="folder for bench.{json,md,png} and the runs' files")
    @click.option("--modes", default="direct,forge,fifo", show_default=True, help="modes to run, in this order")
    @click.option("--repeat", type=click.IntRange(1, 20), default=1, show_default=True,
                  help="run the modes this many times, interleaved")
    @click.option("--concurrency", type=click.IntRange(1, 100_000), default=None,
                  help="function invocations in flight in forge modes (default: forge's)")
    def run_cmd(workload, node_path, records, warmup, direct, out, modes, repeat, concurrency):
        """Run WORKLOAD.yaml in each mode on the node's one card and write the report."""
        _report(do_run(workload, node_path, out, modes, direct, records, warmup, repeat, concurrency))

    @bench.command("sweep")
    @click.argument("contract")
    @click.option("--workload", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                  help="the bench workload (YAML: record count, seed, length mixes, shared prefixes)")
    @_common_run
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True, help="folder for sweep.{json,md,png} and the runs' files")
    @click.option("--tokens", default=None, help="max_num_tokens values, comma-separated (default: ½, 1, 2 x)")
    @click.option("--slots", default=None, help="max_batch_size values, comma-separated (default: ½, 1, 2 x)")
    @click.option("--mode", type=click.Choice(["forge", "direct"]), default="forge", show_default=True,
                  help="measure each tier through the forge path or the direct engine")
    def sweep_cmd(contract, workload, node_path, records, warmup, direct, out, tokens, slots, mode):
        """Vary CONTRACT's token budget and slots (CONTRACT: a name on the node, or its file); report the best tier."""
        variant = direct.split(",")[0].strip()
        _report(do_sweep(contract, workload, node_path, out, tokens, slots, mode, variant, records, warmup))

    @bench.command("control-plane")
    @click.option("--records", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True,
                  help="tasks per run")
    @click.option("--cpu", type=click.IntRange(0, 4096), default=0, show_default=True,
                  help="pin the process to this core (the figure is per core)")
    @click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True,
                  help="runs; the report keeps every run and names the best")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True, help="folder for control-plane.{json,md} and the runs' files")
    def control_plane_cmd(records, cpu, repeat, out):
        """forge's own ceiling in tasks/s: the full path with the instant engine (NO model)."""
        _report(do_control_plane(out, records, cpu, repeat))

    @bench.command("quick")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="folder for the reports; default: a new temporary folder (printed at the end)")
    @click.option("--records", type=click.IntRange(4, 10_000), default=QUICK_RECORDS, show_default=True,
                  help="requests per mode (the sweep's tiers run half as many each)")
    def quick_cmd(out, records):
        """CI-sized: forge's quick workload in the three modes, a 2x2 sweep and the control plane, on CPU."""
        if out is None:
            import tempfile

            out = Path(tempfile.mkdtemp(prefix="forge-bench-quick-"))
        paths = do_run(QUICK_WORKLOAD, None, out, "direct,forge,fifo", "sorted,depth", records, 2, 1, None)
        paths += do_sweep("tiny-llama-cpu", QUICK_WORKLOAD, None, out, "384,768", "16,32", "forge", "depth",
                          max(4, records // 2), 2)
        paths += do_control_plane(out, QUICK_CONTROL_PLANE_RECORDS, None, 1)
        _report(paths)
