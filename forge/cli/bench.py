"""`forge bench`: measured throughput, side by side (docs/benchmarks.md says how to read the reports).

    forge bench run WORKLOAD.yaml      direct engine vs forge vs forge with FIFO, same engine, same work;
                                       with a several-card --node: each card alone, then all together
    forge bench sweep CONTRACT         the engine-tier sweep: the backend's switches, budget, slots, replicas
    forge bench compare WORKLOAD       tiers side by side, interleaved in one process (the sweep's confirm)
    forge bench control-plane          forge's own ceiling in tasks/s with the instant engine (no model)
    forge bench scaling                N CPU-bound cards alone and together, engines in threads vs processes
    forge bench quick                  all three, small, on the embedded CPU node (CI)"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import click

from forge.cli.run import card_transport_option
from forge.errors import ForgeError, UsageError

QUICK_RECORDS = 32
QUICK_CONTROL_PLANE_RECORDS = 3000
REPO = Path(__file__).resolve().parents[2]       # a checkout: `forge bench scaling` reads its workload there
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


def do_run(workload: Path, node_path: Optional[Path], out: Path, modes: Optional[str], direct: str,
           records: Optional[int], warmup: int, repeat: int, concurrency: Optional[int], peaks: Optional[dict] = None,
           card_transport: str = "process", together_records: Optional[int] = None) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.bounds import tier_bounds
    from forge.bench.direct import parse_variants
    from forge.bench.modes import MODES, BenchPlan, ratios, run_modes, single_card
    from forge.bench.report import card_info, check_out_folder, write_bench
    from forge.bench.workload import load_workload, summary

    check_out_folder(out)
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
                "results": [r.to_dict() for r in results], "ratios": ratios(results),
                "bounds": tier_bounds(plan, requests, peaks)}
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


def do_sweep(contract: str, node_path: Optional[Path], out: Path, opts, write_best: Optional[Path] = None,
             write_best_node: Optional[Path] = None, best_name: Optional[str] = None) -> list[Path]:
    import signal

    from forge.bench import candidates as cmod
    from forge.bench import env as envmod
    from forge.bench.bounds import tier_bounds
    from forge.bench.modes import check_fits
    from forge.bench.sweep import Stopped, Sweep, contract_name, plan_of
    from forge.bench.sweep_report import write_sweep
    from forge.bench.tierfile import load_tier
    from forge.bench.report import check_out_folder
    from forge.bench.workload import generate, load_workload, summary

    check_out_folder(out)
    spec = load_workload(opts.workload)
    loaded = _node(node_path)
    name = contract_name(contract)
    plan = plan_of(loaded, name)
    check_fits(spec, plan)
    requests = generate(spec, plan.contract.model.vocab_size, opts.records)
    work = {"file": str(opts.workload), "spec": spec.model_dump(), "summary": summary(requests)}
    started = envmod.describe(load_torch=False)
    sweep = Sweep(loaded, name, opts, out, progress=_say, on_change=lambda: report())
    written: list[Path] = []

    def bounds() -> dict:
        out_ = {}
        cand, _ = sweep.winner()
        for label, c in (("shipped tier", sweep.candidates[0]), ("winner", cand)):
            if c is None or c.folder is None or (label == "winner" and c is sweep.candidates[0]):
                continue
            got = load_tier(Path(c.folder) / "node.yaml")[0]
            if got is not None:
                out_[label] = {"bounds": tier_bounds(got.plans[0], requests, opts.peaks),
                               "window_s": (c.result or {}).get("window_s")}
        return out_

    def env_now() -> dict:
        env = dict(started)
        if sweep.child_env:           # the children imported torch: their GPUs and versions are the real ones
            env["hardware"] = sweep.child_env["hardware"]
            env["software"] = {**env["software"], **sweep.child_env["software"]}
        return env

    def report() -> list[Path]:       # rewritten after every candidate: a cut-off sweep keeps what it measured
        env = env_now()
        cand, why = sweep.winner()
        data = {"kind": "forge-bench-sweep", "env": env, "contract": name, "mode": opts.mode, "workload": work,
                "options": {"records": opts.records, "warmup": opts.warmup, "confirm_records": opts.confirm_records,
                            "confirm_repeat": opts.confirm_repeat, "min_gain": opts.min_gain,
                            "combine": opts.combine, "candidate_limit_s": opts.candidate_limit_s,
                            "deadline_s": opts.deadline_s, "peaks": opts.peaks},
                "strategy": " ".join((cmod.__doc__ or "").split("\n\n", 1)[-1].split()),
                "dimensions": [{"field": d.field, "note": d.note,
                                "choices": [{"value": c.value, "unavailable": c.unavailable, "note": c.note}
                                            for c in d.choices]} for d in sweep.dims],
                "candidates": [c.to_dict() for c in sweep.candidates], "confirm": sweep.confirm,
                "combine_note": sweep.combine_note,
                "winner": {"key": cand.key if cand else None, "why": why,
                           "tokens_per_s": cand.tokens_per_s if cand else None},
                "written": [str(p) for p in written], "bounds": bounds(),
                "elapsed_s": round(time.monotonic() - sweep.t0, 1)}
        return write_sweep(out, data)

    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        sweep.run()
    except Stopped:
        report()
        raise ForgeError(f"sweep stopped (SIGTERM); {out / 'sweep.md'} lists what finished and what was cut") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if write_best is not None:
        from forge.bench.env import hardware_line, software_line

        env = env_now()
        comments = [f"{name}: written by forge bench sweep, {env['date']}", f"hardware: {hardware_line(env)}",
                    f"software: {software_line(env)}", f"command: {env['command']}", f"report: {out / 'sweep.md'}"]
        written += sweep.write_best(write_best, write_best_node, best_name, comments)
        _say("wrote the winner: " + ", ".join(str(p) for p in written))
    return report()


def do_compare(workload: Path, node_paths: list[Path], labels: list[str], out: Path, modes: str, repeat: int,
               records: Optional[int], warmup: int, peaks: dict) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.compare import add_bounds, run_compare, summarize, write_compare
    from forge.bench.report import check_out_folder
    from forge.bench.workload import load_workload, summary

    check_out_folder(out)
    _quiet_engines()
    spec = load_workload(workload)
    labels = list(labels) or [p.stem for p in node_paths]
    if len(labels) != len(node_paths) or len(set(labels)) != len(labels):
        raise UsageError(f"--label: give one distinct label per --node ({len(node_paths)} node(s), labels "
                         f"{', '.join(labels) or 'none'})")
    tiers = [(label, _node(p)) for label, p in zip(labels, node_paths)]
    started = envmod.describe()["date"]

    def report(requests, results) -> list[Path]:
        data = {"kind": "forge-bench-compare", "env": dict(envmod.describe(), date=started), "labels": labels,
                "nodes": [str(p) for p in node_paths], "repeat": repeat,
                "contracts": {label: loaded.plans[0].contract.contract for label, loaded in tiers},
                "workload": {"file": str(workload), "spec": spec.model_dump(), "summary": summary(requests)},
                "results": results, "summary": add_bounds(summarize(labels, results), tiers, requests, peaks)}
        return write_compare(out, data)

    requests, results = run_compare(tiers, spec, out / "work", modes=[m.strip() for m in modes.split(",") if m.strip()],
                                    records=records, warmup=warmup, repeat=repeat, progress=_say, on_result=report)
    return report(requests, results)


def do_control_plane(out: Path, records: int, cpu: Optional[int], repeat: int,
                     card_transport: str = "process") -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.control_plane import run_control_plane, write_control_plane
    from forge.bench.report import check_out_folder

    check_out_folder(out)
    cp = run_control_plane(out / "work", records=records, core=cpu, repeat=repeat, card_transport=card_transport)
    return write_control_plane(out, {"kind": "forge-bench-control-plane", "env": envmod.describe(load_torch=False),
                                     "control_plane": cp})


def do_scaling(out: Path, cards: str, transports: str, speeds: str, step_cpu_ms: float, records: int, repeat: int,
               control_plane_records: int) -> list[Path]:
    from forge.bench import env as envmod
    from forge.bench.cpu_nodes import speeds_of
    from forge.bench.scaling import ScalingPlan, card_counts, run_scaling
    from forge.bench.scaling_report import write_scaling
    from forge.bench.report import check_out_folder
    from forge.bench.workload import load_workload

    check_out_folder(out)
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


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None
    if not values or values[0] <= 0:
        raise UsageError(f"{flag}: expected positive whole numbers, got {text!r}")
    return values


def _peaks(peak_tflops: Optional[float], hbm_tbps: Optional[float]) -> dict:
    return {k: v for k, v in (("peak_tflops", peak_tflops), ("hbm_tbps", hbm_tbps)) if v is not None}


def _peak_options(f):
    f = click.option("--hbm-tbps", type=click.FloatRange(0.001, 1000), default=None,
                     help="memory bandwidth ceiling in TB/s for the bounds (default: the card's datasheet figure)")(f)
    return click.option("--peak-tflops", type=click.FloatRange(0.001, 100_000), default=None,
                        help="dense bf16 ceiling in TFLOP/s for the bounds (default: the card's datasheet figure)")(f)


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


def _quick_skips() -> tuple:
    """Every sweep dimension of the embedded tier but the token budget (a CI-sized sweep: one change, one confirm)."""
    from forge.bench.candidates import TOKENS, dimensions
    from forge.bench.sweep import plan_of

    plan = plan_of(_node(None), "tiny-llama-cpu")
    return tuple(d.field for d in dimensions(plan, mode="forge", overrides={}, skip=()) if d.field != TOKENS)


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
    @_peak_options
    @card_transport_option
    @click.option("--together-records", type=click.IntRange(1, 1_000_000), default=None,
                  help="several cards: records for the all-cards run (default: the same as each card alone)")
    def run_cmd(workload, node_path, records, warmup, direct, out, modes, repeat, concurrency, peak_tflops, hbm_tbps,
                card_transport, together_records):
        """Run WORKLOAD.yaml in each mode and write the report. One card: direct vs forge vs fifo. Several cards:
        each card alone, then all cards on one queue (together ÷ Σ alone, shares against speed, affinity)."""
        _report(do_run(workload, node_path, out, modes, direct, records, warmup, repeat, concurrency,
                       _peaks(peak_tflops, hbm_tbps), card_transport or "process", together_records))

    @bench.command("sweep")
    @click.argument("contract")
    @click.option("--workload", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
                  help="the bench workload (YAML: record count, seed, length mixes, shared prefixes)")
    @click.option("--node", "node_path", default=None, metavar="NODE",
                  help="the node with ONE card running CONTRACT: a node description (NODE.yaml) or the name of one "
                  "shipped with forge; default: local, the embedded CPU node")
    @click.option("--records", type=click.IntRange(1, 1_000_000), default=None,
                  help="requests per candidate (default: the workload file's count)")
    @click.option("--warmup", type=click.IntRange(0, 1024), default=8, show_default=True,
                  help="warm-up requests before each window (own prompts, no shared prefix)")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True, help="folder for sweep.{json,md,png}, candidates/ and confirm/")
    @click.option("--mode", type=click.Choice(["forge", "direct"]), default="forge", show_default=True,
                  help="measure each candidate through the forge path or the direct engine")
    @click.option("--tokens", default=None, help="max_num_tokens values to try, comma-separated (default: ½, 2 x)")
    @click.option("--slots", default=None, help="max_batch_size values to try, comma-separated (default: ½, 2 x)")
    @click.option("--replicas", default=None, help="replicas per card to try, comma-separated (default: 2)")
    @click.option("--set", "sets", multiple=True, metavar="FIELD=V1,V2",
                  help="the values to try for one dimension, e.g. transformers.compile_level=1 (repeatable)")
    @click.option("--skip", "skips", multiple=True, metavar="FIELD", help="leave a dimension out (repeatable)")
    @click.option("--try", "tries", multiple=True, metavar="FIELD=V,FIELD=V",
                  help="also measure this combination as one candidate (repeatable)")
    @click.option("--min-gain", type=click.FloatRange(0, 10), default=0.03, show_default=True,
                  help="a single change joins the combination step when it beats the shipped tier by more than this")
    @click.option("--combine", type=click.IntRange(0, 16), default=4, show_default=True,
                  help="greedy combination steps at most")
    @click.option("--candidate-limit", "candidate_limit_s", type=click.FloatRange(1, 86_400), default=300,
                  show_default=True, help="seconds one candidate may take (process start to exit); then it is cut")
    @click.option("--deadline", "deadline_s", type=click.FloatRange(10, 86_400), default=None,
                  help="seconds the whole sweep may take; candidates that would not fit are cut, the report is "
                       "always written")
    @click.option("--confirm-repeat", type=click.IntRange(0, 10), default=2, show_default=True,
                  help="interleaved repeats of shipped vs best in one process (0: no confirm)")
    @click.option("--confirm-records", type=click.IntRange(1, 1_000_000), default=None,
                  help="requests per confirm run (default: --records)")
    @click.option("--write-best", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="write the winning tier here as a contract file `forge validate` accepts")
    @click.option("--write-best-node", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="also write a one-card node running it (replicas are a card field)")
    @click.option("--best-name", default=None, help="contract name of the written tier (default: CONTRACT's)")
    @_peak_options
    def sweep_cmd(contract, workload, node_path, records, warmup, out, mode, tokens, slots, replicas, sets, skips,
                  tries, min_gain, combine, candidate_limit_s, deadline_s, confirm_repeat, confirm_records,
                  write_best, write_best_node, best_name, peak_tflops, hbm_tbps):
        """Find CONTRACT's best tier on WORKLOAD: the backend's switches, budget, slots and replicas, one change at
        a time, then the winners combined; confirm the best against the shipped tier; write it (docs/benchmarks.md)."""
        from forge.bench.candidates import REPLICAS, SLOTS, TOKENS, parse_sets, parse_try
        from forge.bench.sweep import SweepOptions

        overrides = parse_sets(sets, "--set")
        for flag, text, name in (("--tokens", tokens, TOKENS), ("--slots", slots, SLOTS),
                                 ("--replicas", replicas, REPLICAS)):
            if text is not None:
                overrides[name] = _ints(text, flag)
        if write_best_node is not None and write_best is None:
            raise UsageError("--write-best-node needs --write-best (the node names the written contract)")
        opts = SweepOptions(workload=workload, mode=mode, records=records, warmup=warmup,
                            confirm_records=confirm_records, confirm_repeat=confirm_repeat, min_gain=min_gain,
                            combine=combine, candidate_limit_s=candidate_limit_s, deadline_s=deadline_s,
                            overrides=overrides, skip=tuple(skips), tries=parse_try(tries),
                            peaks=_peaks(peak_tflops, hbm_tbps))
        _report(do_sweep(contract, node_path, out, opts, write_best, write_best_node, best_name))

    @bench.command("compare")
    @click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--node", "node_paths", multiple=True, required=True,
                  type=click.Path(exists=True, dir_okay=False, path_type=Path),
                  help="a one-card node description: one tier (repeat for each tier; the first is the reference)")
    @click.option("--label", "labels", multiple=True, help="a name per --node, in order (default: file stems)")
    @click.option("--modes", default="forge", show_default=True, help="forge and/or direct, comma-separated")
    @click.option("--repeat", type=click.IntRange(1, 20), default=2, show_default=True,
                  help="interleaved repeats: every tier runs every mode once per repeat")
    @click.option("--records", type=click.IntRange(1, 1_000_000), default=None,
                  help="use this many of the workload's records (default: the file's count)")
    @click.option("--warmup", type=click.IntRange(0, 1024), default=8, show_default=True,
                  help="warm-up requests before each window (own prompts, no shared prefix)")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True, help="folder for compare.{json,md} and the runs' files")
    @_peak_options
    def compare_cmd(workload, node_paths, labels, modes, repeat, records, warmup, out, peak_tflops, hbm_tbps):
        """Run WORKLOAD on each tier (--node), interleaved in one process; ratios to the first tier, forge ÷ direct,
        and each tier's measured time beside the hardware's compute and memory bounds."""
        _report(do_compare(workload, list(node_paths), list(labels), out, modes, repeat, records, warmup,
                           _peaks(peak_tflops, hbm_tbps)))

    @bench.command("control-plane")
    @click.option("--records", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True,
                  help="tasks per run")
    @click.option("--cpu", type=click.IntRange(0, 4096), default=0, show_default=True,
                  help="pin the process to this core (the figure is per core)")
    @click.option("--no-pin", is_flag=True, help="do not pin (a card's worker process runs on the cores the node is "
                  "not pinned to); the per-CPU-second figure counts the node's process only")
    @click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True,
                  help="runs; the report keeps every run and names the best")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("forge-bench"),
                  show_default=True, help="folder for control-plane.{json,md} and the runs' files")
    @card_transport_option
    def control_plane_cmd(records, cpu, no_pin, repeat, out, card_transport):
        """forge's own ceiling in tasks/s: the full path with the instant engine (NO model)."""
        _report(do_control_plane(out, records, None if no_pin else cpu, repeat, card_transport or "process"))

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
                  show_default=True, help="tasks per control-plane run (one per transport)")
    def scaling_cmd(out, cards, transports, speeds, step_cpu_ms, records, repeat, control_plane_records):
        """N = 1, 2, 4, 8 CPU-bound instant cards (no model), each alone and together, engines in the node's process
        vs in worker processes; cards at speeds 3:1; the control plane per transport. One report."""
        _report(do_scaling(out, cards, transports, speeds, step_cpu_ms, records, repeat, control_plane_records))

    @bench.command("quick")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="folder for the reports; default: a new temporary folder (printed at the end)")
    @click.option("--records", type=click.IntRange(4, 10_000), default=QUICK_RECORDS, show_default=True,
                  help="requests per mode (the sweep's tiers run half as many each)")
    def quick_cmd(out, records):
        """CI-sized: forge's quick workload in the three modes, a one-change sweep and the control plane, on CPU."""
        if out is None:
            import tempfile

            out = Path(tempfile.mkdtemp(prefix="forge-bench-quick-"))
        paths = do_run(QUICK_WORKLOAD, None, out, "direct,forge,fifo", "sorted,depth", records, 2, 1, None)
        from forge.bench.candidates import TOKENS
        from forge.bench.sweep import SweepOptions

        quick = SweepOptions(workload=QUICK_WORKLOAD, records=max(4, records // 2), warmup=2, confirm_repeat=1,
                             overrides={TOKENS: [768]}, skip=_quick_skips(), candidate_limit_s=120)
        paths += do_sweep("tiny-llama-cpu", None, out, quick)
        paths += do_control_plane(out, QUICK_CONTROL_PLANE_RECORDS, None, 1)
        _report(paths)
