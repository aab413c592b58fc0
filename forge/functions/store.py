"""A job's records, ledger and output as the runner sees them (the ledger's Run, adapted)."""
from __future__ import annotations

import sys
from typing import Any, Iterator, Optional

from forge.errors import ForgeError, display_path
from forge.ledger import make_run_key, open_run
from forge.ledger.shard_set import finished_with_shards_gone, record_shards
from forge.records.guard import refuse_overlaps
from forge.records.shards import open_input
from forge.stats import LedgerStats, RunStats


class JobStore:
    def __init__(self, opts, *, function_name: str, function_file: str, node: str, stats: RunStats):
        self.source = open_input(opts.input_path)
        self.is_pipe = getattr(self.source, "is_pipe", False)
        shards = getattr(self.source, "shards", None)
        _say_skipped(opts.input_path, getattr(self.source, "skipped", ()))
        if shards is not None and not self.is_pipe:
            _refuse_output_among_shards(self.source, opts)
        # the report is written beside the output: never onto the input
        if getattr(opts, "report", False):
            from forge.report import report_paths

            json_path, md_path = report_paths(opts.output_path)
            refuse_overlaps(
                {
                    "--input": opts.input_path,
                    "the report": json_path,
                    "the Markdown report": md_path,
                }
            )
        if self.is_pipe:
            _refuse_pipe_over_earlier_run(opts)
            print(f"forge: --input {opts.input_path} is a pipe: read once as it comes, so this run "
                  "cannot resume "
                  "(stopped early, it starts over with --restart)", file=sys.stderr)
        for what, path in (("output", opts.output_path), ("ledger", opts.ledger_path)):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            # a file where a folder is needed (existing_file/x.jsonl), no permission
            except OSError as e:
                raise ForgeError(f"{display_path(path.parent)}: cannot make the {what}'s folder: "
                                 f"{e.strerror or e}") from None
        total = PIPE_TOTAL if self.is_pipe else self.source.count()
        if shards is not None and not self.is_pipe:
            print(
                f"forge: --input {opts.input_path}: {len(shards):,} shard(s), {total:,} records, "
                "read in path "
                "order (a row's index counts records across the shards in that order)",
                file=sys.stderr,
            )
        key = make_run_key(
            function_file=function_file, function_name=function_name, source=self.source
        )
        self.shards_gone: tuple[str, ...] = ()
        if shards is not None and not self.is_pipe and not opts.restart:
            finished = finished_with_shards_gone(opts.ledger_path, key, self.source.shard_ids)
            # a complete run, its shards only fewer since: it stays complete
            if finished is not None:
                key, total, self.shards_gone = finished.run_key, finished.total, finished.gone
                _say_gone(opts.input_path, self.shards_gone)
        accept = ("function_sha256",) if getattr(opts, "accept_changed_function", False) else ()
        # what the run was counted on (a change is noticed)
        self._fingerprint = self.source.fingerprint()
        where = dict(total=total, info={"node": node, "input": str(opts.input_path)},
                     input_path=None if shards is not None else opts.input_path)
        retry = None
        if getattr(opts, "retry_errors", False):
            from forge.ledger.retry import open_retry

            retry = open_retry(opts.output_path, ledger_path=opts.ledger_path, run_key=key, **where)
            self.run = retry.run
        else:
            self.run = open_run(
                opts.output_path,
                run_key=key,
                ledger_path=opts.ledger_path,
                restart=opts.restart,
                accept_changes=accept,
                **where,
            )
        if shards is not None and not self.is_pipe and not self.shards_gone:
            record_shards(self.run.ledger, self.source.shard_ids())
        rep = self.run.report
        # the run's identity (a --restart makes a new one)
        self.run_id = self.run.ledger.get_meta("created")
        # records invoked more than once, before this start
        self.retried_before = self.run.counts().retried
        self.total = 0 if self.is_pipe else total
        stats.total = self.total
        stats.skipped = len(self.run.settled)
        # records invoked once before and never settled (in flight when a start stopped): invoking
        # one again makes it retried (the ledger's attempts > 1), so this start's live count ends
        # equal to the ledger's growth
        self._once = (
            self.run.ledger.indices("pending", attempts=1)
            if rep.resumed and not rep.complete
            else None
        )
        self.stats = stats
        if retry is not None and retry.error_rows:
            print(
                f"forge: --retry-errors: {retry.error_rows:,} error row(s) taken out of "
                f"{display_path(opts.output_path)} to be made again; its {retry.kept:,} good "
                "row(s) are kept as they "
                "are" + (f" ({retry.function_changed})" if retry.function_changed else ""),
                file=sys.stderr,
            )
        if self.run.ledger.accepted:
            print(f"forge: {display_path(opts.output_path)}: the function file changed; keeping "
                  f"the {stats.skipped:,} "
                  "record(s) already settled, as --accept-changed-function asks", file=sys.stderr)
        if rep.rebuilt:
            print(f"forge: {rep.rebuilt}", file=sys.stderr)
        if rep.resumed and not rep.complete:
            print(f"forge: resuming {display_path(opts.output_path)}: {stats.skipped} of {total} "
                  "records already "
                  f"settled ({rep.recovered} written now from the ledger, {rep.truncated_bytes} "
                  "torn bytes cut)",
                  file=sys.stderr)
        if rep.regenerated and rep.lost_why:
            from forge.ledger.resume import staging_path

            print(f"forge: {display_path(staging_path(opts.output_path))}: an earlier start "
                  "stopped because it "
                  f"{rep.lost_why}; the {rep.regenerated:,} row(s) it lost are made again (every "
                  "row still in it is "
                  "kept)", file=sys.stderr)
        elif rep.regenerated:
            print(f"forge: {display_path(opts.output_path)} was cut short: {rep.regenerated:,} "
                  "row(s) the ledger had "
                  "written were lost with its end; they are made again (every row before the cut "
                  "is kept)",
                  file=sys.stderr)

    def only_shards_gone(self) -> tuple[str, ...]:
        """The shards deleted since this start counted them, when that is the input's only change
        (else ()): the rows of a complete run were made from what was read, and its rerun still
        finds it complete."""
        if self.is_pipe or not hasattr(self.source, "shard_ids"):
            return ()
        then = [tuple(x) for x in self.source.shard_ids()]
        now = {tuple(x) for x in self.source.shard_ids(now=True)}
        gone = tuple(str(x[0]) for x in then if x not in now)
        return gone if gone and now <= set(then) else ()

    def records(self) -> Iterator:
        """The records still to do, never past the line count the run was opened with (an input that
        grows while it is read does not get rows the ledger cannot place)."""
        # `settled` is fixed when the run opens: a fresh run has nothing to skip, so no check per
        # record.
        skip = self.run.is_settled if len(self.run.settled) else None
        if self.is_pipe:        # counted as it is read; its total is known once it ends
            for index, record in self.source.records():
                self.total = self.stats.total = index + 1
                yield index, record
            self.run.total = self.total
            return
        for index, record in self.source.records(skip=skip):
            if index >= self.total:
                return
            yield index, record

    def resume_hint(self) -> str:
        """What to do about records without a row."""
        if self.is_pipe:
            return "a run from a pipe cannot resume: run it again with --restart"
        return "run the same command again to resume"

    def input_changed(self) -> Optional[str]:
        """How the input differs from when the run opened it (size, or its first/last MiB), or
        None."""
        if self.is_pipe:
            return None
        try:
            now = self.source.fingerprint()
        except OSError as e:
            return f"it cannot be read any more ({e.strerror})"
        if now == self._fingerprint:
            return None
        was, size = self._fingerprint["input_size"], now["input_size"]
        return (
            f"it was {was:,} bytes, now {size:,}"
            if was != size
            else "its first or last MiB changed"
        )

    async def started(self, index: int) -> None:
        if self._once is not None and index in self._once:
            self.stats.retried += 1
        await self.run.aput_attempt(index)

    async def result(self, index: int, value: Any) -> bool:
        return await self.run.aput_result(index, value)

    async def error(self, index: int, type_: str, message: str) -> None:
        await self.run.aput_error(index, type_, message)

    def queue_depth(self) -> int:
        c = self.run.committer
        return c.queued if c is not None else 0

    def ledger_stats(self) -> LedgerStats:
        return self.run.stats

    def counts(self):
        return self.run.counts()

    async def __aenter__(self) -> "JobStore":
        return self

    async def __aexit__(self, *exc) -> None:
        self.run.close()


# A pipe's length is unknown until it ends: the run opens on a bound no input reaches and learns its
# total at the end.
PIPE_TOTAL = 1 << 62


def _refuse_pipe_over_earlier_run(opts) -> None:
    if opts.restart:
        return
    for path, what in (
        (opts.ledger_path, "the ledger of an earlier run"),
        (opts.output_path, "an earlier output"),
    ):
        try:
            there = path.stat().st_size > 0
        except OSError:
            there = False
        if there:
            raise ForgeError(f"{display_path(path)}: {what} is there, and --input "
                             f"{opts.input_path} is a pipe: a run "
                             "from a pipe cannot resume (the pipe cannot be read again from where "
                             "the run stopped); "
                             "pass --restart to start over, or choose another --output")


def _say_gone(given, gone: tuple[str, ...]) -> None:
    named = ", ".join(gone[:3]) + (f" and {len(gone) - 3:,} more" if len(gone) > 3 else "")
    print(f"forge: --input {given}: shard(s) {named} deleted since the run read them; the output "
          "keeps their rows",
          file=sys.stderr)


def _say_skipped(given, skipped) -> None:
    """One line for forge's own files a folder or glob held and the input left out (at most three
    named)."""
    if not skipped:
        return
    named = ", ".join(f"{display_path(path)} ({what})" for path, what in skipped[:3])
    more = f" and {len(skipped) - 3:,} more" if len(skipped) > 3 else ""
    print(f"forge: --input {given}: left out {named}{more}: forge never reads its own files as "
          "input",
          file=sys.stderr)


def _refuse_output_among_shards(source, opts) -> None:
    from forge.ledger.resume import staging_path
    from forge.records.guard import same_file

    for path, flag in ((opts.output_path, "--output"), (staging_path(opts.output_path), "--output"),
                       (opts.ledger_path, "--ledger")):
        if source.would_read(path) or any(same_file(path, s.path) for s in source.shards):
            if getattr(source, "single", False):
                raise ForgeError(f"{display_path(path)}: {flag} is the input file --input "
                                 f"{opts.input_path}; forge "
                                 f"would overwrite it: choose another {flag}")
            raise ForgeError(f"{display_path(path)}: {flag} lies among the input shards of --input "
                             f"{opts.input_path}; "
                             "the next run would read it as a shard: write it outside them")


def open_store(
    opts, *, function_name: str, function_file: str, node: str, stats: RunStats
) -> JobStore:
    return JobStore(
        opts, function_name=function_name, function_file=function_file, node=node, stats=stats
    )
