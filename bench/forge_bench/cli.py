"""`forge bench`: measured throughput, side by side (docs/benchmarks.md says how to read the
reports).

    forge bench run WORKLOAD.yaml      direct engine vs forge vs forge with FIFO, same engine, same work;
                                       with a several-card --node: each card alone, then all together
    forge bench sweep CONTRACT         the engine-tier sweep: the backend's switches, budget, slots, replicas
    forge bench compare WORKLOAD       tiers side by side, interleaved in one process (the sweep's confirm)
    forge bench control-plane          forge's own ceiling in tasks/s with the instant engine (no model)
    forge bench scaling                N CPU-bound cards alone and together, engines in threads vs processes
    forge bench quick                  all three, small, on the embedded CPU node (CI)"""
from __future__ import annotations

from pathlib import Path

import click

from forge.cli.run import card_transport_option
from forge.errors import UsageError
from forge_bench.cli_actions import (
    QUICK_CONTROL_PLANE_RECORDS,
    QUICK_RECORDS,
    QUICK_WORKLOAD,
    parse_ints,
    peaks_of,
    quick_skips,
    show_quick_caveat,
    show_report,
    do_compare,
    do_control_plane,
    do_run,
    do_scaling,
    do_sweep,
)


def _peak_options(f):
    f = click.option("--hbm-tbps", type=click.FloatRange(0.001, 1000), default=None,
                     help="memory bandwidth ceiling in TB/s for the bounds (default: the card's "
                          "datasheet figure)")(f)
    return click.option("--peak-tflops", type=click.FloatRange(0.001, 100_000), default=None,
                        help="dense bf16 ceiling in TFLOP/s for the bounds (default: the card's "
                             "datasheet figure)")(f)


def _common_run(f):
    opts = [
        click.option("--node", "node_path", default=None, metavar="NODE",
                     help="the node to provision in this process: a node description (NODE.yaml) "
                          "or the name of one "
                     "shipped with forge; default: local, the embedded CPU node. With several "
                     "cards: each alone, "
                     "then all together"),
        click.option("--records", type=click.IntRange(1, 1_000_000), default=None,
                     help="use this many of the workload's records (default: the file's count)"),
        click.option("--warmup", type=click.IntRange(0, 1024), default=8, show_default=True,
                     help="warm-up requests before each window (own prompts, no shared prefix)"),
        click.option("--direct", default="sorted,depth", show_default=True,
                     help="direct variants: all | sorted | depth (= slots) | depth:N | longest (= "
                          "slots) | longest:N "
                          "(depth, longest requested output first), comma-separated"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def register(cli: click.Group) -> None:
    @cli.group("bench")
    def bench() -> None:
        """Measure throughput: direct engine vs forge vs FIFO, tier sweeps, forge's control-plane
        ceiling."""

    @bench.command("run")
    @click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @_common_run
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("forge-bench"),
        show_default=True,
        help="folder for bench.{json,md,png} and the runs' files",
    )
    @click.option("--modes", default=None, help="modes to run, in this order [default: "
                                                "direct,forge,fifo; with "
                  "several cards: forge,fifo]")
    @click.option(
        "--repeat",
        "--repeats",
        "repeat",
        type=click.IntRange(1, 20),
        default=1,
        show_default=True,
        help="run the modes this many times, interleaved, every other repeat in reverse order",
    )
    @click.option("--concurrency", type=click.IntRange(1, 100_000), default=None,
                  help="function invocations in flight in forge modes (default: forge's)")
    @_peak_options
    @card_transport_option
    @click.option("--together-records", type=click.IntRange(1, 1_000_000), default=None,
                  help="several cards: records for the all-cards run (default: the same as each "
                       "card alone)")
    @click.option("--warm-jobs", type=click.IntRange(0, 10), default=0, show_default=True,
                  help="one card: before each measured run, run this many whole jobs of other "
                       "records (own prompts "
                       "and prefixes, as many records as the measured job) on the same engine, "
                       "outside the window "
                       "(forge and fifo: on the node; direct: through the manager its window uses)")
    @click.option(
        "--direct-process",
        type=click.Choice(["bench", "child"]),
        default="bench",
        show_default=True,
        help="one card, direct mode: run it in the bench's own process (model built "
        "once), or each run in "
        "a fresh process of its own, as every forge run's card worker is",
    )
    def run_cmd(
        workload,
        node_path,
        records,
        warmup,
        direct,
        out,
        modes,
        repeat,
        concurrency,
        peak_tflops,
        hbm_tbps,
        card_transport,
        together_records,
        warm_jobs,
        direct_process,
    ):
        """Run WORKLOAD.yaml in each mode and write the report. One card: direct vs forge vs fifo.
        Several cards: each card alone, then all cards on one queue (together ÷ Σ alone, shares
        against speed, affinity)."""
        show_report(
            do_run(
                workload,
                node_path,
                out,
                modes,
                direct,
                records,
                warmup,
                repeat,
                concurrency,
                peaks_of(peak_tflops, hbm_tbps),
                card_transport or "process",
                together_records,
                warm_jobs,
                direct_process,
            )
        )

    @bench.command("sweep")
    @click.argument("contract")
    @click.option(
        "--workload",
        required=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="the bench workload (YAML: record count, seed, length mixes, shared prefixes)",
    )
    @click.option("--node", "node_path", default=None, metavar="NODE",
                  help="the node with ONE card running CONTRACT: a node description (NODE.yaml) or "
                       "the name of one "
                  "shipped with forge; default: local, the embedded CPU node")
    @click.option("--records", type=click.IntRange(1, 1_000_000), default=None,
                  help="requests per candidate (default: the workload file's count)")
    @click.option("--warmup", type=click.IntRange(0, 1024), default=8, show_default=True,
                  help="warm-up requests before each window (own prompts, no shared prefix)")
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("forge-bench"),
        show_default=True,
        help="folder for sweep.{json,md,png}, candidates/ and confirm/",
    )
    @click.option(
        "--mode",
        type=click.Choice(["forge", "direct"]),
        default="forge",
        show_default=True,
        help="measure each candidate through the forge path or the direct engine",
    )
    @click.option("--tokens", default=None, help="max_num_tokens values to try, comma-separated "
                                                 "(default: ½, 2 x)")
    @click.option("--slots", default=None, help="max_batch_size values to try, comma-separated "
                                                "(default: ½, 2 x)")
    @click.option("--replicas", default=None, help="replicas per card to try, comma-separated "
                                                   "(default: 2)")
    @click.option("--set", "sets", multiple=True, metavar="FIELD=V1,V2",
                  help="the values to try for one dimension, e.g. transformers.compile_level=1 "
                       "(repeatable)")
    @click.option("--skip", "skips", multiple=True, metavar="FIELD", help="leave a dimension out "
                                                                          "(repeatable)")
    @click.option("--try", "tries", multiple=True, metavar="FIELD=V,FIELD=V",
                  help="also measure this combination as one candidate (repeatable)")
    @click.option("--min-gain", type=click.FloatRange(0, 10), default=0.03, show_default=True,
                  help="a single change joins the combination step when it beats the shipped tier "
                       "by more than this")
    @click.option("--combine", type=click.IntRange(0, 16), default=4, show_default=True,
                  help="greedy combination steps at most")
    @click.option(
        "--candidate-limit",
        "candidate_limit_s",
        type=click.FloatRange(1, 86_400),
        default=300,
        show_default=True,
        help="seconds one candidate may take (process start to exit); then it is cut",
    )
    @click.option("--deadline", "deadline_s", type=click.FloatRange(10, 86_400), default=None,
                  help="seconds the whole sweep may take; candidates that would not fit are cut, "
                       "the report is "
                       "always written")
    @click.option("--confirm-repeat", type=click.IntRange(0, 10), default=2, show_default=True,
                  help="interleaved repeats of shipped vs best in one process (0: no confirm)")
    @click.option("--confirm-records", type=click.IntRange(1, 1_000_000), default=None,
                  help="requests per confirm run (default: --records)")
    @click.option("--write-best", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="write the winning tier here as a contract file `forge validate` accepts")
    @click.option(
        "--write-best-node",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="also write a one-card node running it (replicas are a card field)",
    )
    @click.option("--best-name", default=None, help="contract name of the written tier (default: "
                                                    "CONTRACT's)")
    @_peak_options
    def sweep_cmd(
        contract,
        workload,
        node_path,
        records,
        warmup,
        out,
        mode,
        tokens,
        slots,
        replicas,
        sets,
        skips,
        tries,
        min_gain,
        combine,
        candidate_limit_s,
        deadline_s,
        confirm_repeat,
        confirm_records,
        write_best,
        write_best_node,
        best_name,
        peak_tflops,
        hbm_tbps,
    ):
        """Find CONTRACT's best tier on WORKLOAD: the backend's switches, budget, slots and
        replicas, one change at a time, then the winners combined; confirm the best against the
        shipped tier; write it (docs/benchmarks.md)."""
        from forge_bench.candidates import REPLICAS, SLOTS, TOKENS, parse_sets, parse_try
        from forge_bench.sweep import SweepOptions

        overrides = parse_sets(sets, "--set")
        for flag, text, name in (("--tokens", tokens, TOKENS), ("--slots", slots, SLOTS),
                                 ("--replicas", replicas, REPLICAS)):
            if text is not None:
                overrides[name] = parse_ints(text, flag)
        if write_best_node is not None and write_best is None:
            raise UsageError("--write-best-node needs --write-best (the node names the written "
                             "contract)")
        opts = SweepOptions(
            workload=workload,
            mode=mode,
            records=records,
            warmup=warmup,
            confirm_records=confirm_records,
            confirm_repeat=confirm_repeat,
            min_gain=min_gain,
            combine=combine,
            candidate_limit_s=candidate_limit_s,
            deadline_s=deadline_s,
            overrides=overrides,
            skip=tuple(skips),
            tries=parse_try(tries),
            peaks=peaks_of(peak_tflops, hbm_tbps),
        )
        show_report(
            do_sweep(contract, node_path, out, opts, write_best, write_best_node, best_name)
        )

    @bench.command("compare")
    @click.argument("workload", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--node", "node_paths", multiple=True, required=True,
                  type=click.Path(exists=True, dir_okay=False, path_type=Path),
                  help="a one-card node description: one tier (repeat for each tier; the first is "
                       "the reference)")
    @click.option("--label", "labels", multiple=True, help="a name per --node, in order (default: "
                                                           "file stems)")
    @click.option("--modes", default="forge", show_default=True, help="forge and/or direct, "
                                                                      "comma-separated")
    @click.option("--repeat", type=click.IntRange(1, 20), default=2, show_default=True,
                  help="interleaved repeats: every tier runs every mode once per repeat, every "
                       "other repeat in reverse order")
    @click.option("--records", type=click.IntRange(1, 1_000_000), default=None,
                  help="use this many of the workload's records (default: the file's count)")
    @click.option("--warmup", type=click.IntRange(0, 1024), default=8, show_default=True,
                  help="warm-up requests before each window (own prompts, no shared prefix)")
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("forge-bench"),
        show_default=True,
        help="folder for compare.{json,md} and the runs' files",
    )
    @_peak_options
    def compare_cmd(
        workload, node_paths, labels, modes, repeat, records, warmup, out, peak_tflops, hbm_tbps
    ):
        """Run WORKLOAD on each tier (--node), interleaved in one process; ratios to the first tier,
        forge ÷ direct, and each tier's measured time beside the hardware's compute and memory
        bounds."""
        show_report(
            do_compare(
                workload,
                list(node_paths),
                list(labels),
                out,
                modes,
                repeat,
                records,
                warmup,
                peaks_of(peak_tflops, hbm_tbps),
            )
        )

    @bench.command("control-plane")
    @click.option(
        "--records",
        type=click.IntRange(1, 10_000_000),
        default=100_000,
        show_default=True,
        help="tasks per run",
    )
    @click.option("--cpu", type=click.IntRange(0, 4096), default=0, show_default=True,
                  help="pin the process to this core (the figure is per core)")
    @click.option("--no-pin", is_flag=True, help="do not pin (a card's worker process runs on the "
                                                 "cores the node is "
                  "not pinned to); the per-CPU-second figure counts the node's process only")
    @click.option("--repeat", type=click.IntRange(1, 20), default=3, show_default=True,
                  help="runs; the report keeps every run and names the best")
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("forge-bench"),
        show_default=True,
        help="folder for control-plane.{json,md} and the runs' files",
    )
    @card_transport_option
    def control_plane_cmd(records, cpu, no_pin, repeat, out, card_transport):
        """forge's own ceiling in tasks/s: the full path with the instant engine (NO model)."""
        show_report(
            do_control_plane(
                out, records, None if no_pin else cpu, repeat, card_transport or "process"
            )
        )

    @bench.command("scaling")
    @click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("forge-bench-scaling"),
        show_default=True,
        help="folder for scaling.{json,md}, the node files and one report per node",
    )
    @click.option("--cards", default="1,2,4,8", show_default=True, help="card counts N, "
                                                                        "comma-separated")
    @click.option("--transports", default="thread,process", show_default=True,
                  help="card transports to compare: thread (engines in the node process), process "
                       "(one per card)")
    @click.option("--speeds", default="3:1", show_default=True, help="relative speeds of the "
                                                                     "unequal-cards run")
    @click.option(
        "--step-cpu-ms",
        type=click.FloatRange(0.1, 100.0),
        default=4.0,
        show_default=True,
        help="Python CPU per engine step of the fastest card",
    )
    @click.option("--records", type=click.IntRange(50, 100_000), default=600, show_default=True,
                  help="records per card alone (together runs scale them to the same window)")
    @click.option(
        "--repeat",
        "--repeats",
        "repeat",
        type=click.IntRange(1, 10),
        default=2,
        show_default=True,
        help="interleaved repeats of every cell",
    )
    @click.option("--control-plane-records", type=click.IntRange(1000, 10_000_000), default=50_000,
                  show_default=True, help="tasks per control-plane run (one per transport)")
    def scaling_cmd(
        out, cards, transports, speeds, step_cpu_ms, records, repeat, control_plane_records
    ):
        """N = 1, 2, 4, 8 CPU-bound instant cards (no model), each alone and together, engines in
        the node's process vs in worker processes; cards at speeds 3:1; the control plane per
        transport. One report."""
        show_report(
            do_scaling(
                out, cards, transports, speeds, step_cpu_ms, records, repeat, control_plane_records
            )
        )

    @bench.command("quick")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="folder for the reports; default: a new temporary folder (printed at the "
                       "end)")
    @click.option(
        "--records",
        type=click.IntRange(4, 10_000),
        default=QUICK_RECORDS,
        show_default=True,
        help="requests per mode and per sweep tier",
    )
    def quick_cmd(out, records):
        """CI-sized: forge's quick workload in the three modes, a one-change sweep and the control
        plane, on CPU."""
        if out is None:
            import tempfile

            out = Path(tempfile.mkdtemp(prefix="forge-bench-quick-"))
        paths = do_run(
            QUICK_WORKLOAD, None, out, "direct,forge,fifo", "sorted,depth", records, 2, 1, None
        )
        from forge_bench.candidates import TOKENS
        from forge_bench.sweep import SweepOptions

        # No confirm: at this size it re-runs both tiers to re-read a difference inside one run's
        # spread (26 s of the 76 s quick took; `forge bench sweep` confirms, and its test runs one).
        # The shipped tier is the one the forge mode above ran, on the same records: its result is
        # the sweep's base, not measured a second time.
        quick = SweepOptions(workload=QUICK_WORKLOAD, records=records, warmup=2, confirm_repeat=0,
                             overrides={TOKENS: [768]}, skip=quick_skips(), candidate_limit_s=120,
                             base_run=out / "bench.json")
        paths += do_sweep("tiny-llama-cpu", None, out, quick)
        paths += do_control_plane(out, QUICK_CONTROL_PLANE_RECORDS, None, 1)
        show_report(paths)
        show_quick_caveat(paths, records)
