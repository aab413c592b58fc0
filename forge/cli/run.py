"""`forge run` (embedded: provision in-process, then run) and `forge deploy` (against a provisioned
node)."""
from __future__ import annotations

import os
from pathlib import Path

import click

from forge import constants
from forge.cli.interrupt import exit_at_once_until_draining
from forge.cli.node_arg import HELP_DESCRIPTION, HELP_PROVISIONED
from forge.errors import UsageError

CARD_TRANSPORT_HELP = ("where each card's engine runs: 'process' (its own worker process; the "
                       "default) or 'thread' "
                       "(in this process, as before worker processes: for tests and before/after "
                       "benchmarks)")


def card_transport_option(f):
    return click.option("--card-transport", type=click.Choice(["process", "thread"]), default=None,
                        help=CARD_TRANSPORT_HELP)(f)


def _common(f):
    opts = [
        # Paths only: what they name (a folder, a missing file) is forge's to refuse, exit 1, as for
        # every file.
        click.option(
            "--input",
            "input_path",
            type=click.Path(path_type=Path, allow_dash=True),
            help="records: a file, a folder of shards or a quoted glob "
            "('data/*.jsonl.gz'); JSONL (one "
            "object per line; .gz, .zst), Parquet; '-' or <(cmd) reads a pipe (such "
            "a run cannot "
            "resume)",
        ),
        click.option(
            "--openai-batch",
            "openai_batch",
            type=click.Path(path_type=Path),
            default=None,
            metavar="BATCH.jsonl",
            help="run an OpenAI batch file ({custom_id, method, url, body} lines: "
            "/v1/chat/completions, "
            "/v1/completions, /v1/embeddings) with no function file: --output gets "
            "one OpenAI batch "
            "output row per line, in input order (docs/openai_batch.md); instead of "
            "FILE.py and --input",
        ),
        click.option(
            "--output",
            "output_path",
            required=True,
            type=click.Path(path_type=Path),
            help="results: JSONL, or Parquet when the name ends in .parquet",
        ),
        click.option(
            "--ledger",
            "ledger_path",
            type=click.Path(path_type=Path),
            default=None,
            help="task ledger (SQLite); default: beside the output, OUTPUT.ledger.sqlite",
        ),
        click.option(
            "--restart", is_flag=True, help="discard an existing output and ledger and start over"
        ),
        click.option(
            "--accept-changed-function",
            is_flag=True,
            help="the function file changed since the run started, compatibly: keep the "
            "rows already "
            "written and run the rest with the new code",
        ),
        click.option(
            "--retry-errors",
            is_flag=True,
            help="after fixing the function: run again only the records whose rows in "
            "--output are error "
            "rows, keeping every good row (each index stays exactly once). The good "
            "rows must be this "
            "function's over this input (same function name and file name; the "
            "file's content may "
            "have changed); refused otherwise. See docs/ledger.md",
        ),
        click.option(
            "--concurrency",
            type=click.IntRange(1, 100_000),
            default=None,
            help="the most records in flight (fewer while the cards finish fewer in a few "
            "seconds); "
            "default: the function's, else 1024",
        ),
        click.option(
            "--metrics-port",
            type=click.IntRange(0, 65535),
            default=None,
            help="serve Prometheus /metrics on 127.0.0.1:PORT during the run (0 = any free port)",
        ),
        click.option(
            "--progress",
            type=click.Choice(["auto", "bar", "lines", "off"]),
            default="auto",
            help="a live bar on a terminal, periodic lines otherwise",
        ),
        click.option(
            "--report/--no-report", default=True, help="write OUTPUT.report.{json,md} at the end"
        ),
        click.option(
            "--max-errors",
            "max_errors",
            default=None,
            metavar="N|P%",
            help="stop early (incomplete, resumable) once more than N records, or more "
            "than P% of the "
            "records started in this run (counted once "
            f"{constants.MAX_ERRORS_MIN_SAMPLE} have settled), failed",
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _before_loading(metrics_port: int | None) -> None:
    """Refusals that need no engine come before one loads; Ctrl-C until then stops at once."""
    exit_at_once_until_draining("before any record ran (the output is as it was)")
    if metrics_port:
        from forge.machine.ports import check_free

        check_free("127.0.0.1", metrics_port, "metrics endpoint", "--metrics-port")


EXIT_CODES = f"""
\b
Exit codes:
  {constants.EXIT_OK}    complete: every input line has its row, none is an error row
  {constants.EXIT_ERROR_ROWS}    complete, with error rows (the function failed, or a line was unreadable)
  {constants.EXIT_INCOMPLETE}    incomplete: rows are missing (the node went down or froze, --max-errors,
       the output could not be written, the input changed during the run); rerun to resume
  130  incomplete: stopped by SIGINT (143: by SIGTERM); rerun to resume
  {constants.EXIT_FAILED}    refused before the run could start (one line says why): a file or node it names is
       missing, unreadable or not what forge needs (input, output, ledger, function, node)
  {constants.EXIT_USAGE}    usage error: the command line itself (a flag missing or unknown, a value of the
       wrong shape: FILE.py[:NAME], --max-errors, a URL where a description is needed)
"""


def _max_errors(text):
    from forge.functions.errorbudget import MaxErrors

    return None if text is None else MaxErrors.parse(text)


def _retry(retry_errors: bool, restart: bool) -> bool:
    if retry_errors and restart:
        raise UsageError("give --retry-errors (keep the good rows, make the error rows again) or "
                         "--restart (make "
                         "every row again), not both")
    return retry_errors


def _job_runner(target, input_path, openai_batch):
    """(the job's input, the function that runs it): FILE.py over --input, or an OpenAI batch file
    alone."""
    if openai_batch is not None:
        if target is not None or input_path is not None:
            raise UsageError("--openai-batch is the job's input and its function: give no FILE.py "
                             "and no --input")
        from forge.openai_batch.job import run_openai_batch

        return openai_batch, run_openai_batch
    if target is None:
        raise UsageError("missing argument FILE.py[:NAME] (or give --openai-batch BATCH.jsonl)")
    if input_path is None:
        raise UsageError("missing option --input (the records FILE.py runs over)")
    from forge.functions.job import run_with_node

    return input_path, run_with_node


def _ledger_default(output_path: Path, ledger_path: Path | None) -> Path:
    return ledger_path or output_path.with_name(output_path.name + ".ledger.sqlite")


def _warm_node(loaded, token):
    """The same node, already up on this machine, that this run may use
    (forge/machine/warm_node.py), saying so; None (and why, when a node of that name is up) to
    provision one in this process."""
    from forge.machine import warm_node

    entry, why = warm_node.find(loaded, token)
    if why is not None:
        click.echo(f"forge: note: {why}", err=True)
    if entry is not None:
        click.echo(f"forge: using node {entry['node']!r}, already up (pid {entry.get('pid')}); "
                   "--fresh-node "
                   "provisions one in this process", err=True)
    return entry


def register(cli: click.Group) -> None:
    @cli.command("run", epilog=EXIT_CODES)
    @click.argument("target", metavar="FILE.py[:NAME]", required=False)
    @click.option("--node", "node_arg", default=None, metavar="NODE", help=HELP_DESCRIPTION)
    @click.option("--grouping/--no-grouping", default=True, help="broker prefix/length grouping "
                                                                 "(off = FIFO)")
    @click.option("--strict", is_flag=True, help="treat validation warnings as errors")
    @click.option("--fresh-node", is_flag=True,
                  help="provision the node in this process even when the same node (same "
                       "description and "
                  "contracts, started from this checkout) is already up on this machine; without "
                  "it, a run uses "
                  "such a node")
    @card_transport_option
    @_common
    def run_cmd(
        target,
        node_arg,
        grouping,
        strict,
        fresh_node,
        card_transport,
        input_path,
        openai_batch,
        output_path,
        ledger_path,
        restart,
        accept_changed_function,
        retry_errors,
        concurrency,
        metrics_port,
        progress,
        report,
        max_errors,
    ):
        """Run a function over records on a node provisioned in this process, or on the same node
        already up (`forge provision NODE`): see --fresh-node."""
        from forge.cli.node_arg import description_path
        from forge.config.load import load_node
        from forge.functions.job import JobOptions
        from forge.node.local import LocalNode

        input_path, run_with_node = _job_runner(target, input_path, openai_batch)
        budget = _max_errors(max_errors)        # a bad flag is refused before the node loads
        _before_loading(metrics_port)
        loaded = load_node(description_path(node_arg, "run"), strict=strict)
        for w in loaded.warnings:
            click.echo(w.render(), err=True)
        opts = JobOptions(
            target=target,
            input_path=input_path,
            output_path=output_path,
            ledger_path=_ledger_default(output_path, ledger_path),
            restart=restart,
            accept_changed_function=accept_changed_function,
            retry_errors=_retry(retry_errors, restart),
            concurrency=concurrency,
            metrics_port=metrics_port,
            progress=progress,
            report=report,
            max_errors=budget,
        )
        # those two flags shape a node of its own
        if not fresh_node and card_transport is None and grouping:
            token = os.environ.get(loaded.node.control.token_env)
            warm = _warm_node(loaded, token)
            if warm is not None:
                from forge.functions.remote_stats import StatsRemoteNode

                url = warm["control_url"]
                return run_with_node(
                    lambda: StatsRemoteNode(url, token=token), opts, node_label=loaded.node.node
                )
        return run_with_node(
            lambda: LocalNode(
                loaded, grouping=grouping, card_transport=card_transport or "process"
            ),
            opts,
            node_label=loaded.node.node,
        )

    @cli.command("deploy", epilog=EXIT_CODES)
    @click.argument("target", metavar="FILE.py[:NAME]", required=False)
    @click.option("--node", "node", default=None, metavar="NODE", help=HELP_PROVISIONED)
    @click.option("--token-env", default="FORGE_TOKEN", show_default=True,
                  help="environment variable holding the node's bearer token, if it needs one")
    @click.option(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run across every node provisioned on this Ray cluster (see docs/cluster.md)",
    )
    @click.option("--grouping/--no-grouping", default=True,
                  help="with --cluster: broker prefix/length grouping (off = FIFO)")
    @_common
    def deploy_cmd(
        target,
        node,
        token_env,
        cluster,
        grouping,
        input_path,
        openai_batch,
        output_path,
        ledger_path,
        restart,
        accept_changed_function,
        retry_errors,
        concurrency,
        metrics_port,
        progress,
        report,
        max_errors,
    ):
        """Run a function over records against a node provisioned with `forge provision` (or, with
        --cluster, across every node provisioned on a Ray cluster)."""
        from forge.functions.job import JobOptions

        input_path, run_with_node = _job_runner(target, input_path, openai_batch)
        _before_loading(metrics_port)

        opts = JobOptions(
            target=target,
            input_path=input_path,
            output_path=output_path,
            ledger_path=_ledger_default(output_path, ledger_path),
            restart=restart,
            accept_changed_function=accept_changed_function,
            retry_errors=_retry(retry_errors, restart),
            concurrency=concurrency,
            metrics_port=metrics_port,
            progress=progress,
            report=report,
            max_errors=_max_errors(max_errors),
        )
        if cluster is not None:
            if node is not None:
                raise UsageError("give --node or --cluster, not both")
            if openai_batch is not None:
                raise UsageError("--openai-batch runs on one node (forge run, or forge deploy "
                                 "--node), not --cluster")
            from forge.cluster.job import run_cluster

            return run_cluster(cluster, opts, grouping=grouping)
        if not grouping:
            raise UsageError("--no-grouping applies to --cluster jobs (a provisioned node's broker "
                             "is its own)")
        from forge.cli.node_arg import provisioned, require_answer

        info = provisioned(node)
        require_answer(info)
        from forge.functions.remote_stats import StatsRemoteNode
        from forge.machine.registry import whose

        # named by the user, yet not theirs: say so before the job runs
        if "pid" in info and whose(info):
            click.echo(f"forge: note: node {info['node']!r} is {whose(info)} (not started from "
                       "this checkout)",
                       err=True)
        url, token = info["control_url"], os.environ.get(token_env)
        return run_with_node(
            lambda: StatsRemoteNode(url, token=token), opts, node_label=info["node"] or url
        )
