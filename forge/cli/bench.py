"""`forge bench`: measured throughput, side by side (docs/benchmarks.md says how to read the reports).

    forge bench run WORKLOAD.yaml      direct engine vs forge vs forge with FIFO, same engine, same work;
                                       with a several-card --node: each card alone, then all together
    forge bench sweep CONTRACT         the engine-tier sweep (token budget x slots) around a contract
    forge bench control-plane          forge's own ceiling in tasks/s with the instant engine (no model)
    forge bench scaling                N CPU-bound cards alone and together, engines in threads vs processes
    forge bench quick                  all three, small, on the embedded CPU node (CI)"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import click

from forge.errors import UsageError

QUICK_RECORDS = 32
QUICK_CONTROL_PLANE_RECORDS = 3000
REPO = Path(__file__).resolve().parents[2]


def _say(line: str) -> None:
    click.echo(f"forge bench: {line}", err=True)


def _node(node_path: Optional[Path]):
    from forge.config.load import load_node
    from forge.embedded import default_node_path

    loaded = load_node(node_path or default_node_path())
    for w in loaded.warnings:
        click.echo(w.render(), err=True)
    return loaded


def _quiet_engines() -> None:
    """transformers logs per-request warnings at scale; the bench prints its own lines."""
    for name in ("transformers", "transformers.generation"):
        logging.getLogger(name).setLevel(logging.ERROR)


def do_run(workload: Path, node_path: Optional[Path], out: Path, modes: Optional[str], direct: str,
           records: Optional[int], warmup: int, repeat: int, concurrency: Optional[int],
           card_transport: str = "thread", together_records: Optional[int] = None) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.direct import parse_variants
    from forge.bench.modes import MODES, BenchPlan, ratios, run_modes, single_card
    from forge.bench.report import card_info, write_bench
    from forge.bench.workload import load_workload, summary

    _quiet_engines()
    spec = load_workload(workload)
    loaded = _node(node_path)
    if len(loaded.plans) > 1:
        return do_run_cards(workload, spec, loaded, out, modes, records, warmup, repeat, concurrency,
                            card_transport, together_records)
    if together_records is not None:
        raise UsageError("--together-records: this node has one card (it applies to several-card nodes)")
    modes = modes or ",".join(MODES)
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
                   on_result=report, card_transport=card_transport)
    requests, results = run_modes(bp)
    return report(requests, results)


def do_run_cards(workload: Path, spec, loaded, out: Path, modes: Optional[str], records: Optional[int], warmup: int,
                 repeat: int, concurrency: Optional[int], card_transport: str,
                 together_records: Optional[int]) -> list[Path]:
    """A node of several cards: each alone, then together, per mode and repeat (forge/bench/cards.py)."""
    from forge.bench import env as envmod
    from forge.bench.cards import CARD_MODES, CardsPlan, cards_data, run_cards
    from forge.bench.report import write_cards_bench
    from forge.bench.workload import generate, summary

    started = envmod.describe()["date"]
    vocab = min(p.contract.model.vocab_size for p in loaded.plans)
    work = {"file": str(workload), "spec": spec.model_dump(), "summary": summary(generate(spec, vocab, records))}

    def report(results) -> list[Path]:       # rewritten after every run: a cut-off bench keeps its runs
        return write_cards_bench(out, cards_data(env=dict(envmod.describe(), date=started), loaded=loaded,
                                                 workload=work, card_transport=card_transport,
                                                 together_records=together_records, results=results))

    cp = CardsPlan(loaded=loaded, spec=spec, workdir=out / "work", records=records, together_records=together_records,
                   warmup=warmup, repeat=repeat, concurrency=concurrency, card_transport=card_transport,
                   modes=[m.strip() for m in (modes or ",".join(CARD_MODES)).split(",") if m.strip()],
                   progress=_say, on_result=report)
    return report(run_cards(cp))


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


def do_control_plane(out: Path, records: int, cpu: Optional[int], repeat: int,
                     card_transport: str = "thread") -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.control_plane import run_control_plane, write_control_plane

    cp = run_control_plane(out / "work", records=records, core=cpu, repeat=repeat, card_transport=card_transport)
    return write_control_plane(out, {"kind": "forge-bench-control-plane", "env": envmod.describe(load_torch=False),
                                     "control_plane": cp})


def do_scaling(out: Path, cards: str, transports: str, speeds: str, step_cpu_ms: float, records: int, repeat: int,
               control_plane_records: int) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.cpu_nodes import speeds_of
    from forge.bench.scaling import ScalingPlan, card_counts, run_scaling
    from forge.bench.scaling_report import write_scaling
    from forge.bench.workload import load_workload

    workload = REPO / "docs" / "bench" / "workloads" / "cpu-steps.yaml"
    if not workload.is_file():
        raise UsageError(f"{workload} is not here: `forge bench scaling` runs from a forge checkout")
    try:
        ratio = speeds_of(speeds)
    except ValueError as e:
        raise UsageError(f"--speeds: {e}") from None
    kinds = [t.strip() for t in transports.split(",") if t.strip()]
    bad = [t for t in kinds if t not in ("thread", "process")]
    if bad or not kinds:
        raise UsageError(f"--transports: {', '.join(bad) or 'none given'} (choose from thread, process)")
    started = envmod.describe(load_torch=False)["date"]
    sp = ScalingPlan(out=out, spec=load_workload(workload), workload_file=workload.relative_to(REPO),
                     cards=card_counts(cards), transports=kinds, speeds=ratio, step_cpu_ms=step_cpu_ms,
                     records=records, repeat=repeat, control_plane_records=control_plane_records, progress=_say,
                     on_update=lambda data: write_scaling(out, data),
                     env=lambda: dict(envmod.describe(load_torch=False), date=started))
    return write_scaling(out, run_scaling(sp))


def _report(paths: list[Path]) -> None:
    _say("wrote " + ", ".join(str(p) for p in paths))
    md = next((p for p in paths if p.suffix == ".md"), None)
    if md is not None:
        click.echo(md.read_text(encoding="utf-8"))


def _common_run(f):
    opts = [
        click.option("--node", "node_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="node description; default: the embedded CPU node"),
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
    @click.option("--modes", default=None, help="modes to run, in this order [default: direct,forge,fifo; with "
                  "several cards: forge,fifo]")
    @click.option("--repeat", "--repeats", "repeat", type=click.IntRange(1, 20), default=1, show_default=True,
                  help="run the modes this many times, interleaved")
    @click.option("--concurrency", type=click.IntRange(1, 100_000), default=None,
                  help="function invocations in flight in forge modes (default: forge's)")
    @click.option("--card-transport", type=click.Choice(["thread", "process"]), default="thread", show_default=True,
                  help="where each card's engine runs: a thread of the node process, or its own worker process")
    @click.option("--together-records", type=click.IntRange(1, 1_000_000), default=None,
                  help="several cards: records for the all-cards run (default: the same as each card alone)")
    def run_cmd(workload, node_path, records, warmup, direct, out, modes, repeat, concurrency, card_transport,
                together_records):
        """Run WORKLOAD.yaml in each mode and write the report. One card: direct vs forge vs fifo. Several cards:
        each card alone, then all cards on one queue (together ÷ Σ alone, shares against speed, affinity)."""
        _report(do_run(workload, node_path, out, modes, direct, records, warmup, repeat, concurrency, card_transport,
                       together_records))

    @bench.command("sweep")
    @click.argument("contract")
    @click.option("--workload", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @_common_run
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True)
    @click.option("--tokens", default=None, help="max_num_tokens values, comma-separated (default: ½, 1, 2 x)")
    @click.option("--slots", default=None, help="max_batch_size values, comma-separated (default: ½, 1, 2 x)")
    @click.option("--mode", type=click.Choice(["forge", "direct"]), default="forge", show_default=True,
                  help="measure each tier through the forge path or the direct engine")
    def sweep_cmd(contract, workload, node_path, records, warmup, direct, out, tokens, slots, mode):
        """Vary CONTRACT's token budget and slots (CONTRACT: a name on the node, or its file); report the best tier."""
        variant = direct.split(",")[0].strip()
        _report(do_sweep(contract, workload, node_path, out, tokens, slots, mode, variant, records, warmup))

    @bench.command("control-plane")
    @click.option("--records", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True)
    @click.option("--cpu", type=click.IntRange(0, 4096), default=0, show_default=True,
                  help="pin the process to this core (the figure is per core)")
    @click.option("--no-pin", is_flag=True, help="do not pin (e.g. with --card-transport process, whose worker "
                  "would inherit the pin); the per-CPU-second figure still counts this process only")
    @click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True)
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True)
    @click.option("--card-transport", type=click.Choice(["thread", "process"]), default="thread", show_default=True,
                  help="where the instant engine runs: a thread of the node process, or its own worker process")
    def control_plane_cmd(records, cpu, no_pin, repeat, out, card_transport):
        """forge's own ceiling in tasks/s: the full path with the instant engine (NO model)."""
        _report(do_control_plane(out, records, None if no_pin else cpu, repeat, card_transport))

    @bench.command("scaling")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench-scaling"),
                  show_default=True, help="folder for scaling.{json,md}, the node files and one report per node")
    @click.option("--cards", default="1,2,4,8", show_default=True, help="card counts N, comma-separated")
    @click.option("--transports", default="thread,process", show_default=True,
                  help="card transports to compare: thread (engines in the node process), process (one per card)")
    @click.option("--speeds", default="3:1", show_default=True, help="relative speeds of the unequal-cards run")
    @click.option("--step-cpu-ms", type=click.FloatRange(0.1, 100.0), default=4.0, show_default=True,
                  help="Python CPU per engine step of the fastest card")
    @click.option("--records", type=click.IntRange(50, 100_000), default=600, show_default=True,
                  help="records per card alone (together runs scale them to the same window)")
    @click.option("--repeat", "--repeats", "repeat", type=click.IntRange(1, 10), default=2, show_default=True,
                  help="interleaved repeats of every cell")
    @click.option("--control-plane-records", type=click.IntRange(1000, 10_000_000), default=50_000,
                  show_default=True)
    def scaling_cmd(out, cards, transports, speeds, step_cpu_ms, records, repeat, control_plane_records):
        """N = 1, 2, 4, 8 CPU-bound instant cards (no model), each alone and together, engines in the node's process
        vs in worker processes; cards at speeds 3:1; the control plane per transport. One report."""
        _report(do_scaling(out, cards, transports, speeds, step_cpu_ms, records, repeat, control_plane_records))

    @bench.command("quick")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True)
    @click.option("--records", type=click.IntRange(4, 10_000), default=QUICK_RECORDS, show_default=True)
    def quick_cmd(out, records):
        """CI-sized: docs/bench/workloads/quick.yaml in the three modes, a 2x2 sweep and the control plane, on CPU."""
        workload = REPO / "docs" / "bench" / "workloads" / "quick.yaml"
        if not workload.is_file():
            raise UsageError(f"{workload} is not here: `forge bench quick` runs from a forge checkout")
        paths = do_run(workload, None, out, "direct,forge,fifo", "sorted,depth", records, 2, 1, None)
        paths += do_sweep("tiny-llama-cpu", workload, None, out, "384,768", "16,32", "forge", "depth",
                          max(4, records // 2), 2)
        paths += do_control_plane(out, QUICK_CONTROL_PLANE_RECORDS, None, 1)
        _say("wrote " + ", ".join(str(p) for p in paths))
        sys.stdout.flush()
