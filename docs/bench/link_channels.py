"""Which local channel carries a card link best: multiprocessing's Pipe or asyncio streams on a Unix socket.

    python docs/bench/link_channels.py [--tasks 200000] [--batch 1024] [--repeat 5]

The traffic of a link at full speed, without forge around it: the node sends batches of request tuples (the
plain tuples a WireRequest crosses as, forge/host/protocol.py: id, attempt, 8 prompt ids, max tokens, priority,
no options, age) and keeps a long poll open; the worker answers each batch with one batch of result tuples (a
WireResult's fields: id, attempt, finish reason, 1 output id, text, no hidden state, no error, input tokens)
through the poll. At most two batches are in flight,
as the link's credit allows. Both ends pickle each message (protocol 5) with a 4-byte length.

    pipe    multiprocessing.Pipe(); each end reads when its descriptor is readable (loop.add_reader) and
            writes with Connection.send_bytes (a blocking write)
    socket  asyncio streams over socket.socketpair() (what forge/host/channel.py does)

Reported: the node process's CPU seconds per 100k tasks (time.process_time) and tasks per wall second, per
run, interleaved. The worker is a fresh interpreter (multiprocessing spawn) pinned to another core than the
node when the machine has one."""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import pickle
import socket
import struct
import time

HEADER = struct.Struct("!I")


def requests(start: int, n: int) -> list[tuple]:
    return [(f"0123456789ab{i:x}", 0, tuple(3 + (i * 7 + j) % 2000 for j in range(8)), 1, 0, None, 0.001)
            for i in range(start, start + n)]


def results(batch: list[tuple]) -> list[tuple]:
    return [(r[0], r[1], "length", [17], "x", None, None, 8) for r in batch]


# ----------------------------------------------------------------------------- socket (asyncio streams)
async def _frame_read(reader) -> object:
    (n,) = HEADER.unpack(await reader.readexactly(4))
    return pickle.loads(await reader.readexactly(n))


def _frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    return HEADER.pack(len(data)) + data


def socket_worker(sock: socket.socket) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        polls: list[int] = []
        ready: list[tuple] = []

        def flush() -> None:
            while polls and ready:
                writer.write(_frame((polls.pop(0), True, {"results": ready[:], "returned": []})))
                ready.clear()

        while True:
            try:
                cid, method, args = await _frame_read(reader)
            except asyncio.IncompleteReadError:
                return
            if method == "submit":
                writer.write(_frame((cid, True, len(args[1]))))
                ready.extend(results(args[1]))
            else:
                polls.append(cid)
            flush()
    asyncio.run(main())


async def socket_node(sock: socket.socket, tasks: int, batch: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
    calls: dict[int, asyncio.Future] = {}
    ids = iter(range(1 << 62))

    async def read_loop() -> None:
        while True:
            cid, ok, value = await _frame_read(reader)
            calls.pop(cid).set_result(value)

    def call(method: str, *args) -> asyncio.Future:
        cid = next(ids)
        fut = asyncio.get_running_loop().create_future()
        calls[cid] = fut
        writer.write(_frame((cid, method, args)))
        return fut

    await drive(call, tasks, batch, read_loop)
    writer.close()


# ----------------------------------------------------------------------------- pipe (multiprocessing.Connection)
def pipe_worker(conn) -> None:
    polls: list[int] = []
    ready: list[tuple] = []
    while True:
        try:
            cid, method, args = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if method == "submit":
            conn.send_bytes(pickle.dumps((cid, True, len(args[1])), protocol=5))
            ready.extend(results(args[1]))
        else:
            polls.append(cid)
        while polls and ready:
            conn.send_bytes(pickle.dumps((polls.pop(0), True, {"results": ready[:], "returned": []}), protocol=5))
            ready.clear()


async def pipe_node(conn, tasks: int, batch: int) -> None:
    loop = asyncio.get_running_loop()
    calls: dict[int, asyncio.Future] = {}
    ids = iter(range(1 << 62))

    def readable() -> None:
        while conn.poll():
            cid, ok, value = pickle.loads(conn.recv_bytes())
            calls.pop(cid).set_result(value)

    loop.add_reader(conn.fileno(), readable)

    def call(method: str, *args) -> asyncio.Future:
        cid = next(ids)
        fut = loop.create_future()
        calls[cid] = fut
        conn.send_bytes(pickle.dumps((cid, method, args), protocol=5))
        return fut

    async def idle() -> None:
        await asyncio.Event().wait()

    await drive(call, tasks, batch, idle)
    loop.remove_reader(conn.fileno())


# ----------------------------------------------------------------------------- the link's pattern
async def drive(call, tasks: int, batch: int, reader) -> None:
    """Send `tasks` requests in batches, at most two batches in flight; collect results by long poll."""
    bg = asyncio.ensure_future(reader())
    done = sent = 0
    room = asyncio.Event()
    room.set()

    async def collect() -> None:
        nonlocal done
        while done < tasks:
            reply = await call("collect", "s", 0.5, 4096)
            done += len(reply["results"])
            room.set()

    col = asyncio.ensure_future(collect())
    while sent < tasks:
        while sent - done >= 2 * batch:
            room.clear()
            await room.wait()
        n = min(batch, tasks - sent)
        await call("submit", "s", requests(sent, n))
        sent += n
    await col
    bg.cancel()


def run(kind: str, tasks: int, batch: int, worker_cpus) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    if kind == "pipe":
        mine, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_pinned, args=(pipe_worker, theirs, worker_cpus))
    else:
        mine, theirs = socket.socketpair()
        proc = ctx.Process(target=_pinned, args=(socket_worker, theirs, worker_cpus))
    proc.start()
    theirs.close()
    time.sleep(1.0)                       # the worker's interpreter starts outside the window
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "pipe":
        asyncio.run(pipe_node(mine, tasks, batch))
    else:
        asyncio.run(socket_node(mine, tasks, batch))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    mine.close()
    proc.join(10)
    return wall, cpu


def _pinned(target, end, cpus) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    target(end)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    worker_cpus = set(cpus[1:]) or None
    os.sched_setaffinity(0, {cpus[0]})
    print(f"node on core {cpus[0]}, worker on {sorted(worker_cpus) if worker_cpus else 'the same core'}; "
          f"{a.tasks:,} tasks in batches of {a.batch}")
    print("| run | channel | node CPU s per 100k tasks | tasks per wall s |")
    print("| ---: | --- | ---: | ---: |")
    for i in range(a.repeat):
        for kind in ("pipe", "socket"):
            wall, cpu = run(kind, a.tasks, a.batch, worker_cpus)
            print(f"| {i + 1} | {kind} | {cpu / a.tasks * 1e5:.3f} | {a.tasks / wall:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
