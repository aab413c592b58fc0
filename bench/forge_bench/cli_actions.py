"""What each `forge bench` command does, apart from its options (bench/forge_bench/cli.py): load the node, run the
measurement, write the report. The commands' flags are parsed there; these take plain values."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import click

from forge.errors import ForgeError, UsageError


QUICK_RECORDS = 32
QUICK_CONTROL_PLANE_RECORDS = 3000
# a checkout: `forge bench scaling` reads its workload there
REPO = Path(__file__).resolve().parents[2]
QUICK_WORKLOAD = Path(__file__).resolve().parent / "quick.yaml"     # package data


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


def do_run(
    workload: Path,
    node_path: Optional[Path],
    out: Path,
    modes: Optional[str],
    direct: str,
    records: Optional[int],
    warmup: int,
    repeat: int,
    concurrency: Optional[int],
    peaks: Optional[dict] = None,
    card_transport: str = "process",
    together_records: Optional[int] = None,
    warm_jobs: int = 0,
    direct_process: str = "bench",
) -> list[Path]:
    from forge_bench import env as envmod
    from forge_bench.bounds import tier_bounds
    from forge_bench.direct import parse_variants
    from forge_bench.modes import MODES, BenchPlan, ratios, run_modes, single_card
    from forge_bench.report import card_info, check_out_folder, write_bench
    from forge_bench.workload import load_workload, summary

    check_out_folder(out)
    _quiet_engines()
    spec = load_workload(workload)
    loaded = _node(node_path)
    if len(loaded.plans) > 1:
        if warm_jobs:
            raise UsageError("--warm-jobs: this node has several cards (it applies to one-card "
                             "nodes)")
        if direct_process != "bench":
            raise UsageError("--direct-process: this node has several cards (the direct mode is "
                             "for one-card nodes)")
        return do_run_cards(
            workload,
            spec,
            loaded,
            out,
            modes,
            records,
            warmup,
            repeat,
            concurrency,
            card_transport,
            together_records,
        )
    if together_records is not None:
        raise UsageError("--together-records: this node has one card (it applies to several-card "
                         "nodes)")
    modes = modes or ",".join(MODES)
    plan = single_card(loaded)
    started = envmod.describe()["date"]

    # rewritten after every run: a cut-off bench keeps its runs
    def report(requests, results) -> list[Path]:
        # described once torch is loaded (GPUs, versions)
        env = dict(envmod.describe(), date=started)
        data = {
            "kind": "forge-bench",
            "env": env,
            "card": card_info(plan),
            "workload": {
                "file": str(workload),
                "spec": spec.model_dump(),
                "summary": summary(requests),
            },
            "results": [r.to_dict() for r in results],
            "ratios": ratios(results),
            "bounds": tier_bounds(plan, requests, peaks),
        }
        return write_bench(out, data)

    bp = BenchPlan(
        loaded=loaded,
        spec=spec,
        workdir=out / "work",
        records=records,
        warmup=warmup,
        repeat=repeat,
        modes=[m.strip() for m in modes.split(",") if m.strip()],
        concurrency=concurrency,
        direct_variants=parse_variants(direct, plan.contract.limits.max_batch_size),
        progress=_say,
        on_result=report,
        card_transport=card_transport,
        warm_jobs=warm_jobs,
        direct_process=direct_process,
    )
    requests, results = run_modes(bp)
    return report(requests, results)


def do_run_cards(
    workload: Path,
    spec,
    loaded,
    out: Path,
    modes: Optional[str],
    records: Optional[int],
    warmup: int,
    repeat: int,
    concurrency: Optional[int],
    card_transport: str,
    together_records: Optional[int],
) -> list[Path]:
    """A node of several cards: each alone, then together, per mode and repeat (bench/forge_bench/cards.py)."""
    from forge_bench import env as envmod
    from forge_bench.cards import CARD_MODES, CardsPlan, cards_data, run_cards
    from forge_bench.report import write_cards_bench
    from forge_bench.workload import generate, summary

    started = envmod.describe()["date"]
    vocab = min(p.contract.model.vocab_size for p in loaded.plans)
    work = {
        "file": str(workload),
        "spec": spec.model_dump(),
        "summary": summary(generate(spec, vocab, records)),
    }

    def report(results) -> list[Path]:  # rewritten after every run: a cut-off bench keeps its runs
        return write_cards_bench(
            out,
            cards_data(
                env=dict(envmod.describe(), date=started),
                loaded=loaded,
                workload=work,
                card_transport=card_transport,
                together_records=together_records,
                results=results,
            ),
        )

    cp = CardsPlan(
        loaded=loaded,
        spec=spec,
        workdir=out / "work",
        records=records,
        together_records=together_records,
        warmup=warmup,
        repeat=repeat,
        concurrency=concurrency,
        card_transport=card_transport,
        modes=[m.strip() for m in (modes or ",".join(CARD_MODES)).split(",") if m.strip()],
        progress=_say,
        on_result=report,
    )
    return report(run_cards(cp))


def do_sweep(
    contract: str,
    node_path: Optional[Path],
    out: Path,
    opts,
    write_best: Optional[Path] = None,
    write_best_node: Optional[Path] = None,
    best_name: Optional[str] = None,
) -> list[Path]:
    import signal

    from forge_bench import candidates as cmod
    from forge_bench import env as envmod
    from forge_bench.bounds import tier_bounds
    from forge_bench.modes import check_fits
    from forge_bench.sweep import Stopped, Sweep, contract_name, plan_of
    from forge_bench.sweep_report import write_sweep
    from forge_bench.tierfile import load_tier
    from forge_bench.report import check_out_folder
    from forge_bench.workload import generate, load_workload, summary

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
        # the children imported torch: their GPUs and versions are the real ones
        if sweep.child_env:
            env["hardware"] = sweep.child_env["hardware"]
            env["software"] = {**env["software"], **sweep.child_env["software"]}
        return env

    # rewritten after every candidate: a cut-off sweep keeps what it measured
    def report() -> list[Path]:
        env = env_now()
        cand, why = sweep.winner()
        data = {
            "kind": "forge-bench-sweep",
            "env": env,
            "contract": name,
            "mode": opts.mode,
            "workload": work,
            "options": {
                "records": opts.records,
                "warmup": opts.warmup,
                "confirm_records": opts.confirm_records,
                "confirm_repeat": opts.confirm_repeat,
                "min_gain": opts.min_gain,
                "combine": opts.combine,
                "candidate_limit_s": opts.candidate_limit_s,
                "deadline_s": opts.deadline_s,
                "peaks": opts.peaks,
            },
            "strategy": " ".join((cmod.__doc__ or "").split("\n\n", 1)[-1].split()),
            "dimensions": [
                {
                    "field": d.field,
                    "note": d.note,
                    "choices": [
                        {"value": c.value, "unavailable": c.unavailable, "note": c.note}
                        for c in d.choices
                    ],
                }
                for d in sweep.dims
            ],
            "candidates": [c.to_dict() for c in sweep.candidates],
            "confirm": sweep.confirm,
            "combine_note": sweep.combine_note,
            "winner": {
                "key": cand.key if cand else None,
                "why": why,
                "tokens_per_s": cand.tokens_per_s if cand else None,
            },
            "written": [str(p) for p in written],
            "bounds": bounds(),
            "elapsed_s": round(time.monotonic() - sweep.t0, 1),
        }
        return write_sweep(out, data)

    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        sweep.run()
    except Stopped:
        report()
        raise ForgeError(f"sweep stopped (SIGTERM); {out / 'sweep.md'} lists what finished and "
                         "what was cut") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if write_best is not None:
        from forge_bench.env import hardware_line, software_line

        env = env_now()
        comments = [
            f"{name}: written by forge bench sweep, {env['date']}",
            f"hardware: {hardware_line(env)}",
            f"software: {software_line(env)}",
            f"command: {env['command']}",
            f"report: {out / 'sweep.md'}",
        ]
        written += sweep.write_best(write_best, write_best_node, best_name, comments)
        _say("wrote the winner: " + ", ".join(str(p) for p in written))
    return report()


def do_compare(
    workload: Path,
    node_paths: list[Path],
    labels: list[str],
    out: Path,
    modes: str,
    repeat: int,
    records: Optional[int],
    warmup: int,
    peaks: dict,
) -> list[Path]:
    from forge_bench import env as envmod
    from forge_bench.compare import add_bounds, run_compare, summarize, write_compare
    from forge_bench.report import check_out_folder
    from forge_bench.workload import load_workload, summary

    check_out_folder(out)
    _quiet_engines()
    spec = load_workload(workload)
    labels = list(labels) or [p.stem for p in node_paths]
    if len(labels) != len(node_paths) or len(set(labels)) != len(labels):
        raise UsageError(f"--label: give one distinct label per --node ({len(node_paths)} node(s), "
                         "labels "
                         f"{', '.join(labels) or 'none'})")
    tiers = [(label, _node(p)) for label, p in zip(labels, node_paths)]
    started = envmod.describe()["date"]

    def report(requests, results) -> list[Path]:
        data = {
            "kind": "forge-bench-compare",
            "env": dict(envmod.describe(), date=started),
            "labels": labels,
            "nodes": [str(p) for p in node_paths],
            "repeat": repeat,
            "contracts": {label: loaded.plans[0].contract.contract for label, loaded in tiers},
            "workload": {
                "file": str(workload),
                "spec": spec.model_dump(),
                "summary": summary(requests),
            },
            "results": results,
            "summary": add_bounds(summarize(labels, results), tiers, requests, peaks),
        }
        return write_compare(out, data)

    requests, results = run_compare(
        tiers,
        spec,
        out / "work",
        modes=[m.strip() for m in modes.split(",") if m.strip()],
        records=records,
        warmup=warmup,
        repeat=repeat,
        progress=_say,
        on_result=report,
    )
    return report(requests, results)


def do_control_plane(out: Path, records: int, cpu: Optional[int], repeat: int,
                     card_transport: str = "process") -> list[Path]:
    from forge_bench import env as envmod
    from forge_bench.control_plane import run_control_plane, write_control_plane
    from forge_bench.report import check_out_folder

    check_out_folder(out)
    cp = run_control_plane(
        out / "work", records=records, core=cpu, repeat=repeat, card_transport=card_transport
    )
    return write_control_plane(
        out,
        {
            "kind": "forge-bench-control-plane",
            "env": envmod.describe(load_torch=False),
            "control_plane": cp,
        },
    )


def do_scaling(
    out: Path,
    cards: str,
    transports: str,
    speeds: str,
    step_cpu_ms: float,
    records: int,
    repeat: int,
    control_plane_records: int,
) -> list[Path]:
    from forge_bench import env as envmod
    from forge_bench.cpu_nodes import speeds_of
    from forge_bench.scaling import ScalingPlan, card_counts, run_scaling
    from forge_bench.scaling_report import write_scaling
    from forge_bench.report import check_out_folder
    from forge_bench.workload import load_workload

    check_out_folder(out)
    workload = REPO / "docs" / "bench" / "workloads" / "cpu-steps.yaml"
    if not workload.is_file():
        raise UsageError(
            f"{workload} is not here: `forge bench scaling` runs from a forge checkout"
        )
    try:
        ratio = speeds_of(speeds)
    except ValueError as e:
        raise UsageError(f"--speeds: {e}") from None
    kinds = [t.strip() for t in transports.split(",") if t.strip()]
    bad = [t for t in kinds if t not in ("thread", "process")]
    if bad or not kinds:
        raise UsageError(f"--transports: {', '.join(bad) or 'none given'} (choose from thread, "
                         "process)")
    started = envmod.describe(load_torch=False)["date"]
    sp = ScalingPlan(
        out=out,
        spec=load_workload(workload),
        workload_file=workload.relative_to(REPO),
        cards=card_counts(cards),
        transports=kinds,
        speeds=ratio,
        step_cpu_ms=step_cpu_ms,
        records=records,
        repeat=repeat,
        control_plane_records=control_plane_records,
        progress=_say,
        on_update=lambda data: write_scaling(out, data),
        env=lambda: dict(envmod.describe(load_torch=False), date=started),
    )
    return write_scaling(out, run_scaling(sp))


def show_report(paths: list[Path]) -> None:
    _say("wrote " + ", ".join(str(p) for p in paths))
    md = next((p for p in paths if p.suffix == ".md"), None)
    if md is not None:
        click.echo(md.read_text(encoding="utf-8"))


def show_quick_caveat(paths: list[Path], records: int) -> None:
    """What the quick figures are and are not, and where each of its reports is (only the first is printed)."""
    _say(f"the quick figures are a smoke check, not a measurement: {records} requests of the tiny "
         "CPU model, one "
         "repeat, on whatever else this machine is running; `forge ÷ direct` says forge's path "
         "works and roughly "
         "what it costs at this size, not its throughput on a GPU or a real workload (measure that "
         "with "
         "`forge bench run WORKLOAD.yaml --node NODE.yaml`; measured figures: docs/benchmarks.md)")
    for p in paths:
        if p.suffix == ".md":
            _say(f"report: {p}")


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated whole numbers, got {text!r}") from None
    if not values or values[0] <= 0:
        raise UsageError(f"{flag}: expected positive whole numbers, got {text!r}")
    return values


def peaks_of(peak_tflops: Optional[float], hbm_tbps: Optional[float]) -> dict:
    return {
        k: v for k, v in (("peak_tflops", peak_tflops), ("hbm_tbps", hbm_tbps)) if v is not None
    }


def quick_skips() -> tuple:
    """Every sweep dimension of the embedded tier but the token budget (a CI-sized sweep: one change, one confirm)."""
    from forge_bench.candidates import TOKENS, dimensions
    from forge_bench.sweep import plan_of

    plan = plan_of(_node(None), "tiny-llama-cpu")
    return tuple(
        d.field for d in dimensions(plan, mode="forge", overrides={}, skip=()) if d.field != TOKENS
    )
