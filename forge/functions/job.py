"""A whole job, from CLI options to exit code: load the function, open the ledger, bring up (or
reach) the node, run the records, write the summary and the report."""
from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from forge import constants
from forge.errors import ForgeError
from forge.functions.errorbudget import MaxErrors
from forge.functions.api import FunctionSpec
from forge.functions.loader import load_function
from forge.functions.progress import Progress
from forge.functions.runner import RunOutcome, run_records
from forge.node.interface import Node
from forge.stats import RunStats


@dataclass
class JobOptions:
    target: str
    input_path: Path
    output_path: Path
    ledger_path: Path
    restart: bool = False
    concurrency: Optional[int] = None
    metrics_port: Optional[int] = None
    progress: str = "auto"
    report: bool = True
    # the user declares the changed function compatible with done rows
    accept_changed_function: bool = False
    max_errors: Optional[MaxErrors] = None
    # run again only the records whose rows are errors (forge/ledger/retry.py)
    retry_errors: bool = False
    # a function made in code (an OpenAI batch job), not from `target`
    function: Optional[FunctionSpec] = None


def run_with_node(make_node: Callable[[], Node], opts: JobOptions, *, node_label: str = "") -> int:
    """Load the function and open the job's input, ledger and output (everything that can refuse the
    job answers before any engine loads; a run already complete answers at once), then start the
    node `make_node()` builds (a forge.node.interface.Node: local, remote or cluster), run the job,
    and stop the node whatever happens. The node's stats feed the report."""
    from forge.functions.store import open_store

    spec = opts.function or load_function(opts.target)
    stats = RunStats()
    store = open_store(
        opts,
        function_name=spec.name,
        function_file=spec.fn.__code__.co_filename,
        node=node_label,
        stats=stats,
    )
    try:
        if store.run.report.complete:
            return _already_complete(store, opts)
        node = make_node()

        async def main() -> int:
            try:
                await node.start()
                # a function that checks its work against the node first
                node_up = spec.extra.get("node_up")
                if node_up is not None:
                    node_up(node)
                return await _run(
                    spec,
                    node,
                    opts,
                    node_label=node.name,
                    engine_stats=node.engine_stats,
                    broker_stats=node.broker_stats,
                    store=store,
                    stats=stats,
                )
            finally:
                await node.stop()

        return asyncio.run(main())
    finally:
        store.run.close()


def _already_complete(store, opts: JobOptions) -> int:
    from forge.errors import display_path

    c = store.counts()
    if store.run.total == 0 and not store.run.report.resumed:    # a first run over an empty input
        print(f"forge: {display_path(opts.input_path)} holds no records: nothing to run; "
              f"{display_path(opts.output_path)} holds no rows", file=sys.stderr)
        return constants.EXIT_OK
    print(
        f"forge: {display_path(opts.output_path)} is already complete: all {store.run.total:,} "
        "records are in it "
        f"({c.written_errors:,} of them error rows); nothing to do (--restart runs it again)",
        file=sys.stderr,
    )
    # what the output holds
    return constants.EXIT_ERROR_ROWS if c.written_errors else constants.EXIT_OK


async def _run(
    spec,
    node: Node,
    opts: JobOptions,
    *,
    node_label: str,
    engine_stats,
    broker_stats,
    store,
    stats: RunStats,
) -> int:
    stats.started_at = time.time()          # the run's clock starts once the node is up
    metrics = None
    try:
        if opts.metrics_port is not None:
            from forge.metrics import ForgeMetrics

            metrics = ForgeMetrics()
            _, port = metrics.serve("127.0.0.1", opts.metrics_port)
            print(f"forge: metrics on http://127.0.0.1:{port}/metrics", file=sys.stderr, flush=True)
        from forge.report import Sampler

        sampler = Sampler(
            engines=engine_stats or (lambda: []),
            broker=broker_stats,
            run=lambda: stats,
            ledger=store.ledger_stats,
            metrics=metrics,
            node=node_label,
            function=spec.name,
        )
        concurrency = opts.concurrency or spec.concurrency or constants.DEFAULT_RECORD_CONCURRENCY
        with Progress(opts.progress, stats, label=spec.name) as progress:
            def tick() -> None:
                stats.writer_queue = store.queue_depth()
                progress.update()
                sampler.sample()

            try:
                async with store:
                    outcome: RunOutcome = await run_records(
                        spec=spec,
                        node=node,
                        records=store.records(),
                        sink=store,
                        stats=stats,
                        concurrency=concurrency,
                        on_tick=tick,
                        max_errors=opts.max_errors,
                    )
            # the output or the ledger cannot be written (a full disk, ...): rows missing
            except ForgeError as e:
                note = getattr(e, "resume_note", None) or ("every row written so far is kept — "
                                                           "once that is fixed, "
                                                           "run the same command again to resume")
                print(f"forge: stopped: {e}; {note}", file=sys.stderr)
                return constants.EXIT_INCOMPLETE
        counts = store.counts()
        # the records this start made retried (attempts > 1)
        stats.retried = counts.retried - store.retried_before
        stats.writer_queue = 0                                    # closed: every row is written
        await node.refresh_stats()
        code, verdict = _verdict(outcome, store, counts, opts)
        summary = _summary(
            spec.name, node_label, opts, outcome, engine_stats, broker_stats, counts, code
        )
        _print_summary(summary)
        if opts.report:
            _write_report(opts.output_path, summary, sampler, run_id=store.run_id,
                          resumed=store.run.report.resumed, starts=store.run.ledger.starts)
        if verdict:
            print(f"forge: {verdict}", file=sys.stderr)
        return code
    finally:
        if metrics is not None:
            metrics.close()


def _verdict(outcome: RunOutcome, store, counts, opts: JobOptions) -> tuple[int, str]:
    """The exit code (constants.EXIT_*) and the line that says it ('' for a clean, complete run)."""
    from forge.errors import display_path

    total = store.total
    missing = total - counts.written
    again = (
        store.resume_hint()
        if hasattr(store, "resume_hint")
        else "run the same command again to resume"
    )
    changed = store.input_changed()
    gone = store.only_shards_gone() if changed is not None and not missing else ()
    # every row was made from the shards as read: the output is complete, and stays so on a rerun
    if gone:
        print(f"forge: --input {display_path(opts.input_path)}: shard(s) {', '.join(gone[:3])} "
              "deleted during the run, "
              "after they were read; the output holds their rows", file=sys.stderr)
        changed = None
    if changed is not None:  # rows were made for the input as counted at the start: not this input
        return constants.EXIT_INCOMPLETE, (
            f"stopped: the input {display_path(opts.input_path)} changed during the run "
            f"({changed}); {missing:,} of "
            f"{total:,} records have no row; its ledger belongs to the input as it was: pass "
            "--restart to start "
            "over on the input as it is now")
    if outcome.fatal:
        return constants.EXIT_INCOMPLETE, (f"stopped: {outcome.fatal}; {missing:,} of {total:,} "
                                           "records have no row "
                                           f"yet and stay in the ledger — {again}")
    if missing and outcome.interrupted:
        drained = (
            f"{outcome.returned} record(s) in flight went back to the ledger"
            if outcome.returned
            else "every record in flight finished"
        )
        return (130 if outcome.interrupted == "SIGINT" else 143,
                f"stopped by {outcome.interrupted} ({drained}); {again}")
    if missing:
        return (
            constants.EXIT_INCOMPLETE,
            f"incomplete: {missing:,} of {total:,} records have no row yet; {again}",
        )
    if counts.written_errors:
        return constants.EXIT_ERROR_ROWS, (f"complete, with error rows: {counts.written_errors:,} "
                                           f"of the {total:,} "
                                           f"rows in {display_path(opts.output_path)} are errors "
                                           "(exit "
                                           f"{constants.EXIT_ERROR_ROWS})")
    return constants.EXIT_OK, ""


def _summary(
    name: str,
    node: str,
    opts: JobOptions,
    outcome: RunOutcome,
    engine_stats,
    broker_stats,
    counts,
    code: int,
) -> dict:
    s = outcome.stats
    wall = max(outcome.wall_s, 1e-9)
    engines = engine_stats() if engine_stats else []
    b = broker_stats() if broker_stats else None
    return {
        "function": name,
        "node": node,
        "input": str(opts.input_path),
        "output": str(opts.output_path),
        "records_total": s.total,
        "records_done": s.done,
        "records_failed": s.failed,
        "records_resumed": s.skipped,
        # the records this start made retried (invoked again after an earlier start left them in
        # flight: the ledger's attempts > 1; a report merged over every start sums them to the
        # ledger's count), the engine requests given back and done again, the output's error rows
        # (whichever start wrote them), the exit code
        "retried": s.retried,
        "requeued": sum(e.requests_requeued for e in engines),
        "error_rows": counts.written_errors,
        "exit": code,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        # generated tokens/s is what the console calls tok/s; tokens_per_s (prompt + generated) is
        # kept for reports read by older tools
        "output_tokens_per_s": s.output_tokens / wall,
        "prompt_tokens_per_s": s.input_tokens / wall,
        "tokens_per_s": (s.input_tokens + s.output_tokens) / wall,
        "wall_s": wall,
        "interrupted": outcome.interrupted,
        "cards": [
            {
                "node": e.node,
                "card": e.card,
                "tier": e.tier,
                "input_tokens": e.input_tokens,
                "output_tokens": e.output_tokens,
                "requests": e.requests_ok,
                "stalls": e.stalls,
                "progress_only_steps": e.progress_only_steps,
            }
            for e in engines
        ],
        "padding_ratio": b.padding_ratio if b else None,
        "prefix_reuse_ratio": b.prefix_reuse_ratio if b else None,
        "finished_at": time.time(),
    }


def _print_summary(s: dict) -> None:
    print(f"forge: {s['function']} on {s['node']}: {s['records_done']} done, {s['records_failed']} "
          "failed, "
          f"{s['records_resumed']} resumed, {s['retried']} retried"
          + (f", {s['requeued']} requeued" if s.get("requeued") else "")
          + f" | generated {s['output_tokens']:,} tokens, {s['output_tokens_per_s']:,.0f} tok/s · "
            "prompt "
          f"{s['input_tokens']:,} tokens, {s['prompt_tokens_per_s']:,.0f} tok/s | "
          f"{s['wall_s']:.1f} s", file=sys.stderr)


def _write_report(output: Path, summary: dict, sampler, **continued) -> None:
    """The output is what matters: a report that cannot be written (a name too long, a read-only
    folder, a file there that forge did not write) is one warning line, never a failed job."""
    from forge.errors import display_path
    from forge.records.guard import report_overwrite_problem
    from forge.report import report_paths, write_report

    json_path, md_path = report_paths(output)
    json_before = _identity(json_path)
    try:
        problem = report_overwrite_problem(json_path, kind="json") or report_overwrite_problem(
            md_path, kind="md"
        )
        if problem is None:
            # A file name that is not UTF-8 is quoted escaped: the report is text.
            printable = {
                k: v.encode("utf-8", "backslashreplace").decode("utf-8")
                if isinstance(v, str)
                else v
                for k, v in summary.items()
            }
            paths = write_report(output, printable, sampler, **continued)
            print(f"forge: report {', '.join(display_path(p) for p in paths)}", file=sys.stderr)
            return
        why = f"{problem}; forge never writes over a file it did not write"
    except OSError as e:
        why = f"{display_path(e.filename)}: {e.strerror}" if e.filename else str(e)
    except UnicodeError:
        why = "the output's file name is not UTF-8, and the report quotes it"
    except Exception as e:  # noqa: BLE001 - whatever it is, the rows are written; say so and carry on
        why = f"{type(e).__name__}: {e}"
    # the JSON report went in before the failure: say so, truly
    if _identity(json_path) != json_before:
        print(f"forge: warning: report {display_path(json_path)} written, but not "
              f"{display_path(md_path)}: {why}",
              file=sys.stderr)
        return
    print(f"forge: warning: no report written: {why}", file=sys.stderr)


def _identity(path: Path) -> tuple[int, int] | None:
    """A file's (inode, mtime): the report is replaced by a rename, so a report written anew has
    another."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
