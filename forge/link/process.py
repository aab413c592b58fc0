"""The process transport: the engine host in a worker process this node started
(forge/host/worker.py).

Spawned: `python -P -c BOOT FD` (forge/link/worker_argv.py: forge.host's main, of the node's own
forge) is a fresh interpreter that inherits nothing of the node's state but its environment and one
end of a Unix socket pair, over which it gets its WorkerSpec and answers the link's calls
(forge/host/channel.py). Not multiprocessing's "spawn" start method: that one re-runs the parent's
main module in every child (a user's script that starts a node without an `if __name__ ==
"__main__"` guard would start it again in each worker; a pytest or CLI main would be imported for
nothing). A worker that dies (SIGKILL, a crash, the OOM killer) is started again, at most
WORKER_RESTARTS times over the node's life; then the card is given up (the link's state "gone"). An
engine that reports its own failure is not restarted: like a card whose engine failed in-process,
the card has failed (the node goes down when no card is left)."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import time
from typing import Any, Optional

from forge import constants
from forge.config.plan import CardPlan
from forge.errors import ForgeError, engine_failed_to_start
from forge.host.worker import WorkerSpec
from forge.host.channel import CallChannel, frame, open_socket
from forge.host.protocol import Hello, HostMethod
from forge.link.transport import LinkGone, Transport
from forge.link.worker_argv import worker_argv

log = logging.getLogger("forge.link.process")

WORKER_RESTARTS = 3
STOP_GRACE_S = 5.0  # after its engine stopped, a worker has this long to exit before it is killed


class ProcessTransport(Transport):
    def __init__(
        self,
        plan: CardPlan,
        *,
        node: str,
        stall_window_s: float = constants.STALL_WINDOW_S,
        cpus: Optional[frozenset[int]] = None,
        restarts: int = WORKER_RESTARTS,
    ):
        """cpus: the cores the worker may run on (default: wherever the node may). The worker keeps
        the node's logger levels."""
        levels = {name: lg.level for name, lg in logging.root.manager.loggerDict.items()
                  if isinstance(lg, logging.Logger) and lg.level != logging.NOTSET}
        self.spec = WorkerSpec(
            plan=plan,
            node=node,
            parent_pid=os.getpid(),
            stall_window_s=stall_window_s,
            log_levels=levels,
            cpu_affinity=cpus,
        )
        self.max_restarts = restarts
        self.name = plan.engine_id
        self.restarts = 0
        self.loaded = False                 # the current worker has said hello (its engine is up)
        self.proc: Optional[subprocess.Popen] = None
        self.channel: Optional[CallChannel] = None
        self._sock: Optional[socket.socket] = None

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def launch(self) -> None:
        """Start the worker now (it loads its engine while the node goes on with its own setup).
        Call it from the thread that runs the node's loop: the worker's parent-death signal follows
        that thread."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            argv = worker_argv(theirs.fileno())  # the node's own forge, wherever the user stands
            self.proc = subprocess.Popen(
                argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        # small, and the socket buffer holds it: the worker reads it first
        mine.sendall(frame(self.spec))
        self._sock, self.loaded = mine, False

    async def start(self) -> Hello:
        """The worker's hello, once its engine is loaded (bounded by ENGINE_START_TIMEOUT_S)."""
        if self._sock is None:
            self.launch()
        sock, self._sock = self._sock, None
        reader, writer = await open_socket(sock)
        self.channel = CallChannel(reader, writer, on_eof=lambda why: None)
        try:
            info = await self.hello(timeout_s=constants.ENGINE_START_TIMEOUT_S)
            self.loaded = True
            return info
        except ForgeError:
            await self._end()
            raise
        except (ConnectionError, asyncio.TimeoutError) as e:
            await self._end()
            what = (
                f"its worker process exited with code {self.proc.returncode}"
                if self.proc.returncode is not None
                else f"its worker did not answer within {constants.ENGINE_START_TIMEOUT_S:g} s "
                f"({type(e).__name__})"
            )
            raise engine_failed_to_start(
                self.name, self.spec.plan.contract.contract, what
            ) from None

    async def call(self, method: HostMethod, *args: Any, timeout_s: float) -> Any:
        if self.channel is None:
            raise ConnectionError(f"card {self.name}: no worker")
        return await self.channel.call(method.value, *args, timeout_s=timeout_s)

    async def reconnect(self, why: str, *, engine_failed: bool, incarnation: str) -> Hello:
        if engine_failed:
            raise LinkGone(why)
        while True:
            await self._end()
            code = self.proc.returncode if self.proc is not None else None
            lost = f"{why}; its worker exited with code {code}" if code is not None else why
            if self.restarts >= self.max_restarts:
                raise LinkGone(f"{lost}; {self.max_restarts} restart(s) spent")
            self.restarts += 1
            log.warning(
                "card %s: worker lost (%s); starting it again (restart %d of %d)",
                self.name,
                lost,
                self.restarts,
                self.max_restarts,
            )
            self.launch()
            try:
                return await self.start()
            except ForgeError as e:
                why = str(e)

    async def close(self, timeout_s: float) -> None:
        """Stop the engine through the link (bounded), then make sure the process is gone (a worker
        still loading its engine is killed at once: it holds nothing)."""
        stopped = False
        if self.loaded and self.channel is not None and self.channel.closed is None:
            try:
                await self.stop(timeout_s=timeout_s)
                stopped = True
            except Exception as e:  # noqa: BLE001 - it is killed below
                log.warning(
                    "card %s: worker did not stop cleanly (%s: %s)", self.name, type(e).__name__, e
                )
        await self._end()
        if stopped and self.proc is not None and self.proc.returncode != 0:
            log.warning(
                "card %s: worker did not stop cleanly (exit code %s)",
                self.name,
                self.proc.returncode,
            )

    async def _end(self) -> None:
        """Close the channel (the worker sees end of file and exits); kill it if it lingers; reap
        it."""
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        proc = self.proc
        if proc is None:
            return
        if not self.loaded and proc.poll() is None:
            proc.kill()                     # still loading its engine: nothing in it to wait for
        deadline = time.monotonic() + STOP_GRACE_S
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if proc.poll() is None:
            log.error("card %s: worker pid %d did not exit; killed", self.name, proc.pid)
            proc.kill()
            await asyncio.to_thread(proc.wait, 5.0)

