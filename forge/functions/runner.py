"""The job loop: records -> bounded pool of function invocations -> results -> ledger -> output.

Producer decoupling: one reader task feeds a bounded queue; `concurrency` worker tasks each run one
record's function at a time (its generate calls go to the node's broker, which batches across all
workers); finished rows go to the sink (ledger first, then the output file). Every queue is bounded,
so a slow engine back-pressures the reader and memory stays flat however large the input.

Of those workers, only as many start records as the cards finish soon (pace.py: the rate records
finish x a few seconds, never fewer than the cards' slots need), and each record's later calls go
ahead of other records' first ones (llm.py, CURRENT_RECORD): rows reach the ledger in a steady
stream, and a kill loses only the few records in flight."""
from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

from forge.errors import ForgeError, NodeDown
from forge.functions.api import FunctionSpec
from forge.functions.errorbudget import MaxErrors
from forge.functions.llm import CURRENT_RECORD, NodeLLM, RecordCalls
from forge.functions.pace import RecordPace
from forge.gc_tuning import tune_for_throughput
from forge.node.interface import Node
from forge.watchdogs.loopwatch import LoopWatch
from forge.stats import RunStats

READ_CHUNK = 256            # records parsed per slice of reader work
DRAIN_GRACE_S = 30.0        # on SIGINT/SIGTERM: let in-flight records finish this long, then stop


@dataclass
class RunOutcome:
    stats: RunStats
    interrupted: Optional[str] = None     # the signal name, when stopped by one
    # why the run stopped early (node down, --max-errors): unfinished records stay pending
    fatal: Optional[str] = None
    returned: int = 0  # records in flight when stopped, cut short: pending in the ledger
    wall_s: float = 0.0


def error_row(index: int, exc: BaseException) -> dict:
    try:
        message = str(exc) or type(exc).__name__
    except Exception:  # noqa: BLE001 - the user's exception cannot even print itself; the record still fails
        message = f"<{type(exc).__name__} whose message cannot be printed>"
    if not isinstance(exc, ForgeError):
        # Name where in the user's code it raised: the last frame, without the whole traceback.
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            f = frames[-1]
            message = f"{message} (at {f.filename}:{f.lineno} in {f.name})"
    return {"index": index, "error": {"type": type(exc).__name__, "message": message[:4000]}}


def card_slots(node: Node) -> Optional[int]:
    """The slots of the node's cards as they last reported (None before any has)."""
    try:
        return sum(s.slots for s in node.engine_stats()) or None
    except Exception:  # noqa: BLE001 - a node that cannot say: the pace keeps its floor
        return None


def _tell(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run_records(
    *,
    spec: FunctionSpec,
    node: Node,
    records,
    sink,
    stats: RunStats,
    concurrency: int,
    on_tick: Callable[[], None] = lambda: None,
    tick_s: float = 0.25,
    install_signals: bool = True,
    notice: Callable[[str], None] = _tell,
    max_errors: Optional[MaxErrors] = None,
) -> RunOutcome:
    """records: iterable of (index, dict | InputError). sink: started/result/error coroutines
    (bounded). max_errors: stop starting records once this run's error rows pass it (outcome.fatal
    says so)."""
    tune_for_throughput()
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=max(2 * concurrency, 16))
    llm = NodeLLM(node, spec, stats=stats)
    pace = RecordPace(concurrency)
    stop = asyncio.Event()          # start no new record
    # stop waiting for the records in flight (a second signal, a broken sink)
    hurry = asyncio.Event()
    # the sink (ledger / output) failed: nothing more can be settled
    broken: list[BaseException] = []
    outcome = RunOutcome(stats=stats)
    t0 = time.monotonic()

    def on_signal(name: str) -> None:
        again = "press Ctrl-C again" if name == "SIGINT" else f"send {name} again"
        if outcome.interrupted is None:
            outcome.interrupted = name
            stop.set()
            notice(f"forge: {name}: stopping — no new record starts; waiting up to "
                   f"{DRAIN_GRACE_S:g} s for the "
                   f"{stats.in_flight:,} record(s) in flight to finish; {again} to stop now (they "
                   "stay in the "
                   "ledger and run next time)")
        else:  # a second Ctrl-C: in-flight records go back to the ledger now
            hurry.set()
            notice(f"forge: {name} again: stopping now; {stats.in_flight:,} record(s) in flight go "
                   "back to the ledger")

    # Signals are read by a watchdog thread, not by loop callbacks: a function blocking the loop in
    # synchronous code must not make Ctrl-C wait for it (forge/watchdogs/loopwatch.py); it also
    # names such a function.
    watch = LoopWatch(loop, on_signal) if install_signals else None
    if watch is not None and not watch.start():
        watch = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig.name)
            except (NotImplementedError, RuntimeError, ValueError):
                pass

    async def reader() -> None:
        it = iter(records)
        while not stop.is_set():
            # Reading and parsing is blocking work: do it off the loop, a bounded slice at a time.
            chunk = await asyncio.to_thread(lambda: list(itertools.islice(it, READ_CHUNK)))
            if not chunk:
                break
            for item in chunk:
                await queue.put(item)
            stats.producer_queue = queue.qsize()

    async def worker() -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except BaseException as e:      # only the sink raises here: stop the run, do not wait on it
            broken.append(e)
            stop.set()
            hurry.set()
            raise

    def check_budget() -> None:
        """Whenever a record settles, success or failure: a share needs MAX_ERRORS_MIN_SAMPLE
        settled, and when every record starts at once the failures (which return at once) may all
        settle before that; a check made only on a failure would then never come. Past the limit the
        function is judged broken: no record starts and the ones in flight go back to the ledger now
        (like a second Ctrl-C), the same command resumes."""
        if max_errors is None or outcome.fatal is not None:
            return
        settled = stats.done + stats.failed
        # in flight: the others (this record is counted settled)
        started = settled + stats.in_flight - 1
        if max_errors.exceeded(stats.failed, settled, started):
            outcome.fatal = (f"{max_errors.describe(stats.failed, started)}; the function looks "
                             "broken: see its error rows")
            stop.set()
            hurry.set()

    async def work() -> None:
        while True:
            await pace.enter()
            try:
                if not await run_one():
                    return
            finally:
                pace.leave()

    async def run_one() -> bool:
        """Take one record and settle it; False once there is nothing more to start."""
        item = await queue.get()
        stats.producer_queue = queue.qsize()       # drains to 0 once the input is read
        if item is None or stop.is_set():     # stopped: a record not started stays unattempted
            return False
        index, record = item
        stats.in_flight += 1
        try:
            if not isinstance(record, dict):          # an input line that could not be read
                stats.failed += 1
                await sink.error(index, record.type, record.message)
                check_budget()  # after its row is handed to the sink: it is kept
                return True
            await sink.started(index)
            # this worker task's context: the function's calls
            calls = CURRENT_RECORD.set(RecordCalls())
            try:
                result = await spec.fn(record, llm)
            except asyncio.CancelledError:
                raise
            except NodeDown as e:   # not this record's fault: leave it pending, stop the run
                if outcome.fatal is None:
                    outcome.fatal = str(e)
                stop.set()
                return True
            # the record fails, the run goes on (even sys.exit in user code)
            except BaseException as e:
                row = error_row(index, e)["error"]
                stats.failed += 1
                await sink.error(index, row["type"], row["message"])
            else:
                # not serialisable: an error row went in
                if await sink.result(index, result) is False:
                    stats.failed += 1
                else:
                    stats.done += 1
            finally:
                CURRENT_RECORD.reset(calls)
            check_budget()
            return True
        finally:
            stats.in_flight -= 1

    async def ticker() -> None:
        while True:
            stats.records_limit = pace.adjust(
                time.monotonic(), stats.done + stats.failed, card_slots(node)
            )
            on_tick()
            await asyncio.sleep(tick_s)

    async def close_queue() -> None:
        for _ in workers:
            await queue.put(None)

    tick = asyncio.create_task(ticker())
    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    finished = asyncio.gather(*workers, return_exceptions=True)
    read = asyncio.create_task(reader())
    stop_wait = asyncio.create_task(stop.wait())
    hurry_wait = asyncio.create_task(hurry.wait())
    closer: Optional[asyncio.Task] = None
    try:
        await asyncio.wait({read, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set():
            read.result()  # surface reader errors
            closer = asyncio.create_task(close_queue())
            # A signal (or a broken sink) may still come while the last records run: keep listening.
            await asyncio.wait({finished, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set() and not finished.done():
            pace.unbound()                  # workers waiting to start a record find none
            for t in (read, closer):
                if t is not None:
                    t.cancel()
            await asyncio.gather(read, *([closer] if closer else []), return_exceptions=True)
            # drop queued (unstarted) records: they stay pending in the ledger
            while not queue.empty():
                queue.get_nowait()
            for _ in workers:
                queue.put_nowait(None)  # wakes idle workers; room: the queue holds 2 x concurrency
            await asyncio.wait(
                {finished, hurry_wait}, timeout=DRAIN_GRACE_S, return_when=asyncio.FIRST_COMPLETED
            )
        outcome.returned = stats.in_flight if not finished.done() else 0
        for w in workers:
            w.cancel()
        await finished
        if broken:
            raise broken[0]
        for w in workers:
            if not w.cancelled() and w.exception() is not None:
                raise w.exception()
    finally:
        for t in (tick, read, stop_wait, hurry_wait, closer, *workers):
            if t is not None:
                t.cancel()
        await asyncio.gather(
            tick,
            read,
            stop_wait,
            hurry_wait,
            *([closer] if closer else []),
            *workers,
            return_exceptions=True,
        )
        if watch is not None:
            watch.close()
        elif install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
        on_tick()
    outcome.wall_s = time.monotonic() - t0
    return outcome
