"""The background committer: batches settled rows into one ledger transaction, then appends their
output lines with one write + fsync, then marks them written in the next transaction.

Producers hand rows over through a bounded queue (rows and bytes): when the disk is slower than the
producers they wait (back-pressure) instead of growing memory. The order per batch is the durability
protocol: ledger commit -> output write + fsync -> 'written' (committed with the next batch)."""
from __future__ import annotations

import asyncio
import collections
import threading
import time

from forge import constants
from forge.errors import ForgeError, display_path
from forge.ledger.sqlite import Ledger
from forge.records.writer import OutputWriter

_ATTEMPT, _ROW = 0, 1
_PUT_POLL_S = 0.1          # a blocked producer re-checks the committer's health this often
# Ledger meta key: set (to why) when the output stopped being the file this run wrote (deleted,
# replaced, cut); the next start then makes again the rows the ledger had marked written and the
# output lost (resume.py).
OUTPUT_LOST = "output_lost"


class OutputLost(ForgeError):
    """The output was deleted, replaced or cut short while the run wrote it: the run stops (exit
    4)."""

    resume_note = "run the same command again: it makes again only the rows the output lost"


class Committer:
    """Owns the writer side of a run from one thread. `put_*` from threads, `aput_row` from
    asyncio."""

    def __init__(self, ledger: Ledger, writer: OutputWriter, *,
                 interval_s: float = constants.LEDGER_COMMIT_INTERVAL_S,
                 max_rows: int = constants.LEDGER_COMMIT_MAX_ROWS,
                 max_queue_rows: int | None = None, max_queue_bytes: int = 64 << 20) -> None:
        self.ledger, self.writer = ledger, writer
        self.interval_s, self.max_rows = interval_s, max_rows
        self.max_queue_rows = max_queue_rows or 4 * max_rows
        self.max_queue_bytes = max_queue_bytes
        self.rows_written = 0           # output lines made durable by this committer
        self.error: BaseException | None = None
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._thread = threading.Thread(
            target=self._run, name="forge-ledger-committer", daemon=True
        )
        self._thread.start()

    # --- producers -----------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._queue)

    async def aput_attempt(self, index: int) -> None:
        await self._aput((_ATTEMPT, index, None, False, 16))

    async def aput_row(self, index: int, line: str, is_error: bool) -> None:
        await self._aput((_ROW, index, line, is_error, len(line) + 64))

    async def _aput(self, item: tuple) -> None:
        # Never block the event loop on a full queue: park on a future the committer resolves
        # when it takes a batch (and re-check at least every _PUT_POLL_S, so no wake-up is lost).
        # the usual case, room in the queue: no future made (two per record)
        if self._try_put(item):
            return
        loop = asyncio.get_running_loop()
        while True:
            space = loop.create_future()
            if self._try_put(item, waiter=(loop, space)):
                return
            await asyncio.wait([space], timeout=_PUT_POLL_S)

    def _try_put(self, item: tuple, waiter: tuple | None = None) -> bool:
        with self._cond:
            self._raise_if_failed()
            if self._stopping:
                raise ForgeError(
                    "internal: a row was handed to the ledger after the run was closed"
                )
            if self._full():
                if waiter is not None:
                    self._async_waiters.append(waiter)
                return False
            self._queue.append(item)
            self._queued_bytes += item[4]
            if len(self._queue) == self.max_rows:   # a full batch: no need to wait out the interval
                self._cond.notify_all()
            return True

    def _full(self) -> bool:
        # An empty queue always takes one item, so one huge row cannot wedge the run.
        return bool(self._queue) and (len(self._queue) >= self.max_queue_rows
                                      or self._queued_bytes >= self.max_queue_bytes)

    def _wake_async_waiters(self) -> None:
        """Under self._cond: resolve every parked async producer's future on its own loop."""
        for loop, future in self._async_waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass
        self._async_waiters.clear()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error if isinstance(self.error, ForgeError) else ForgeError(
                f"ledger committer failed: {type(self.error).__name__}: {self.error}")

    # --- the committer thread --------------------------------------------------------------
    def _take(self) -> tuple[list[tuple], bool]:
        """Up to max_rows items, waiting at most interval_s once the first arrived (or idle)."""
        deadline = time.monotonic() + self.interval_s
        with self._cond:
            while len(self._queue) < self.max_rows and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            n = min(len(self._queue), self.max_rows)
            items = [self._queue.popleft() for _ in range(n)]
            self._queued_bytes -= sum(it[4] for it in items)
            self._cond.notify_all()
            self._wake_async_waiters()
            return items, self._stopping and not self._queue

    def _run(self) -> None:
        # durable in the output, not yet 'written' in the ledger
        to_mark: list[tuple[int, bool]] = []
        try:
            while True:
                items, last = self._take()
                attempts = [it[1] for it in items if it[0] == _ATTEMPT]
                rows = [(it[1], it[2], it[3]) for it in items if it[0] == _ROW]
                if to_mark:
                    self._check_output()        # the rows to mark are still in the output
                if attempts or rows or to_mark:
                    self.ledger.apply(attempts=attempts, settled=rows, written=to_mark)  # 1. commit
                    to_mark = []
                if rows:
                    # never append to a file cut short: its rows would follow a torn one
                    self._check_output()
                    try:
                        self.writer.append([line for _, line, _ in rows])  # 2. write
                        self.writer.sync()                                 #    + fsync
                    except OSError as e:
                        raise ForgeError(f"{self.writer.path}: cannot write the output: "
                                         f"{e.strerror or e}") from None
                    self._check_output()  # they went into the output, not a file deleted meanwhile
                    self.rows_written += len(rows)
                    to_mark = [(i, err) for i, _, err in rows]  # 3. next txn
                if last:
                    if to_mark:
                        self._check_output()
                        self.ledger.apply(written=to_mark)
                    return
        except BaseException as e:  # kept and raised in the producers and in close()
            with self._cond:
                self.error = e
                self._cond.notify_all()
                self._wake_async_waiters()

    def _check_output(self) -> None:
        """Stop (OutputLost) when the output is no longer the file written; the ledger keeps why,
        for the rerun."""
        why = self.writer.lost()
        if why is None:
            return
        try:
            self.ledger.set_meta(OUTPUT_LOST, why)
        except ForgeError:
            pass  # the ledger cannot be written either: that rerun refuses, naming the lost rows
        raise OutputLost(f"{display_path(self.writer.path)}: {why}; the rows written to it are not "
                         "in the output "
                         "and no more rows go into it")

    def close(self, timeout_s: float = 300.0) -> None:
        """Drain everything queued (commit, write, mark written) and stop. Raises the thread's
        error."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise ForgeError(f"ledger committer did not finish within {timeout_s:.0f} s")
        self._raise_if_failed()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
