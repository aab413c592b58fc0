"""A card worker process: one engine host, spawned by its node (forge.host's main,
forge/link/worker_argv.py: a fresh interpreter, nothing of the node's state inherited), answering
the node's link over one socket (FD).

The process owns everything process-wide its engine touches (torch's default dtype, the CUDA
context, lazy imports), so the cards of a node load at the same time without racing. It dies with
its node: the kernel kills it when the node dies (PR_SET_PDEATHSIG), a watchdog exits it when its
parent changes, and it exits when the node's end of the socket closes. SIGINT and SIGTERM are the
node's to handle (a terminal's Ctrl-C reaches the whole process group): the node drains its workers
and stops them through the link."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from forge import constants
from forge.config.plan import CardPlan
from forge.errors import ForgeError, engine_failed_to_start
from forge.gc_tuning import tune_for_throughput
from forge.host.lifeline import EXIT_ORPHANED, die_with_parent, watch_parent

log = logging.getLogger("forge.host.worker")

EXIT_START_FAILED = 5


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, pickled to it at spawn."""

    plan: CardPlan
    node: str
    parent_pid: int
    stall_window_s: float = constants.STALL_WINDOW_S
    # the node's logger levels, kept here too
    log_levels: dict[str, int] = field(default_factory=dict)
    cpu_affinity: Optional[frozenset[int]] = None  # where the node wants its workers to run
    # the engine library's output to $FORGE_HOME/logs/NODE/CARD.log (engine_log.py)
    engine_log: bool = True

    @property
    def label(self) -> str:
        return self.plan.engine_id              # card id, or card.rN for one replica of a card


def main(fd: int) -> None:
    """fd: this end of the node's socket pair. The node's first frame on it is this worker's
    WorkerSpec."""
    pdeathsig = die_with_parent()
    sock = socket.socket(fileno=fd)
    spec = _read_spec(sock)
    if spec.cpu_affinity and hasattr(os, "sched_setaffinity"):
        # Before any thread starts: the call binds the calling thread, and threads inherit it when
        # they are made.
        os.sched_setaffinity(0, spec.cpu_affinity)
    watch_parent(spec.parent_pid, what=f"card worker {spec.label}")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    for name, level in spec.log_levels.items():
        logging.getLogger(name).setLevel(level)
    if spec.engine_log:
        from forge.host.engine_log import divert

        # before any engine library is imported: all it writes goes to the file
        divert(spec.node, spec.label)
    host, error = None, None
    try:
        from forge.host.engine_host import EngineHost
        from forge.host.tokenizer import for_node

        # No session lease: this worker's one peer is its parent over a socket pair, whose death is
        # end of file here (and the lifeline); its silence is a busy loop (a function blocking it),
        # not a lost link.
        host = EngineHost(
            spec.plan,
            node=spec.node,
            stall_window_s=spec.stall_window_s,
            node_tokenizer=for_node,
            session_lease_s=None,
        )
        host.lifeline = {"pdeathsig": pdeathsig, "parent": spec.parent_pid}
        # The engine is loaded: freeze it out of the cyclic collector, which otherwise walks the
        # model's objects in every full pass while the generation thread waits for the GIL
        # (docs/benchmarks.md, "Control plane").
        tune_for_throughput()
    except ForgeError as e:
        error = str(e)
    except BaseException as e:  # noqa: BLE001 - whatever stops the engine from loading is the card's, in one line
        error = str(engine_failed_to_start(spec.plan.card_id, spec.plan.contract.contract, e))
    rc = asyncio.run(_serve(host, error, sock))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # engine threads are done or abandoned: do not wait for them at interpreter exit


def _read_spec(sock: socket.socket) -> WorkerSpec:
    """The first frame, read before any event loop exists (blocking, bounded: the node sent it at
    spawn)."""
    import pickle

    from forge.host.channel import HEADER

    sock.settimeout(60.0)
    try:
        header = _recv_exactly(sock, HEADER.size)
        spec = pickle.loads(_recv_exactly(sock, HEADER.unpack(header)[0]))
    except (OSError, EOFError) as e:  # the node died before we started: nothing to do
        print(
            f"forge: card worker pid {os.getpid()}: no spec from the node ({e})",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_ORPHANED)
    sock.settimeout(None)
    return spec


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the node closed its end")
        buf += chunk
    return bytes(buf)


async def _serve(host: Any, error: Optional[str], sock: socket.socket) -> int:
    from forge.host.channel import open_socket, serve_calls
    from forge.host.protocol import HostMethod

    reader, writer = await open_socket(sock)

    async def dispatch(method: str, args: tuple) -> Any:
        if error is not None:
            raise ForgeError(error)
        try:
            name = HostMethod(method).value
        except ValueError:
            raise ForgeError(f"the engine host has no call {method!r}") from None
        return await getattr(host, name)(*args)

    why = await serve_calls(reader, writer, dispatch)
    if error is not None:
        return EXIT_START_FAILED
    if not host.stopped:
        # The node went away without stopping us (it died, or was killed): nobody will collect
        # anything.
        log.error("card worker %s exits: %s before it stopped the engine", host.plan.card_id, why)
        return EXIT_ORPHANED
    return 0
