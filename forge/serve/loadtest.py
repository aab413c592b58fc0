"""Load test for `forge serve`: many concurrent HTTP clients on loopback, bounded in count and in time.

    python -m forge.serve.loadtest --spawn --clients 2000          # starts `forge serve` on the embedded node
    python -m forge.serve.loadtest --url http://127.0.0.1:8471 --clients 200

Every client makes `--requests` attempts in sequence: plain completions, streamed chat completions, the
`classify` function when it is served, and (every `--disconnect-every`-th client) a long completion it
abandons mid-flight. A 429 is counted and its Retry-After honoured (capped) before the next attempt. The run
stops by itself at `--time-limit-s`; whatever is still waiting then counts as hung. Afterwards the server's own
books must settle: no caller waiting, nothing in flight in any engine, no KV block reserved, nothing queued."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Optional

import httpx

MODEL = "tiny-llama-cpu"
PROMPTS = [
    "Alice was beginning to",
    "The Mock Turtle said",
    "Down the Rabbit-Hole",
    "`Off with her head!' the Queen",
]


@dataclass
class LoadConfig:
    clients: int = 2000
    requests: int = 2                # attempts per client
    max_tokens: int = 16
    disconnect_every: int = 10       # every N-th client abandons a long request mid-flight
    max_backoff_s: float = 2.0       # Retry-After is honoured up to this
    time_limit_s: float = 180.0
    settle_limit_s: float = 30.0
    model: str = MODEL
    token: Optional[str] = None


@dataclass
class Outcomes:
    counts: Counter = field(default_factory=Counter)
    ok_latency: list = field(default_factory=list)
    refused_latency: list = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return {}
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]     # noqa: E731
    return {"p50_ms": round(pick(0.5) * 1000, 1), "p90_ms": round(pick(0.9) * 1000, 1),
            "p99_ms": round(pick(0.99) * 1000, 1), "max_ms": round(xs[-1] * 1000, 1)}


async def _attempt(http: httpx.AsyncClient, kind: str, i: int, cfg: LoadConfig) -> httpx.Response:
    prompt = PROMPTS[i % len(PROMPTS)]
    if kind == "function":
        return await http.post("/v1/functions/classify", json={"id": i, "text": prompt})
    if kind == "chat_stream":
        body = {
            "model": cfg.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": cfg.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code == 200:
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                if not lines or lines[-1] != "data: [DONE]" or '"error"' in "".join(lines[-2:]):
                    raise RuntimeError("stream did not end with a clean [DONE]")
            else:
                await r.aread()
            return r
    body = {"model": cfg.model, "prompt": prompt, "max_tokens": cfg.max_tokens, "temperature": 0}
    r = await http.post("/v1/completions", json=body)
    if r.status_code == 200 and not isinstance(r.json()["choices"][0]["text"], str):
        raise RuntimeError("completion without text")
    return r


async def _abandon(http: httpx.AsyncClient, i: int, cfg: LoadConfig, out: Outcomes) -> None:
    """Start a long streamed completion and hang up once the server has admitted it (its 200 and first event
    arrived), mid-generation; a 429 is retried after its Retry-After."""
    body = {
        "model": cfg.model,
        "messages": [{"role": "user", "content": PROMPTS[i % 4]}],
        "max_tokens": 128,
        "temperature": 0,
        "stream": True,
    }
    for _ in range(cfg.requests):
        try:
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code == 200:
                    async for _line in r.aiter_lines():
                        break  # the role event: the request is in the node now
                    await asyncio.sleep(0.02 + (i % 7) * 0.03)
                    out.counts["disconnected"] += 1
                    return                                  # leaving the block drops the connection
                await r.aread()
        except Exception as e:  # noqa: BLE001
            out.failures[f"abandon: {type(e).__name__}"] += 1
            out.counts["failed"] += 1
            return
        if r.status_code != 429:
            out.counts["failed"] += 1
            out.failures[f"abandon: HTTP {r.status_code}"] += 1
            return
        out.counts["refused_429_before_disconnect"] += 1
        await asyncio.sleep(min(float(r.headers.get("retry-after", "1")), cfg.max_backoff_s))


async def _client(
    i: int, http: httpx.AsyncClient, cfg: LoadConfig, out: Outcomes, functions: bool
) -> None:
    if cfg.disconnect_every and i % cfg.disconnect_every == cfg.disconnect_every - 1:
        return await _abandon(http, i, cfg, out)
    for _ in range(cfg.requests):
        kind = (
            "function"
            if functions and i % 7 == 3
            else "chat_stream"
            if i % 5 == 1
            else "completion"
        )
        t0 = time.monotonic()
        out.counts["attempts"] += 1
        try:
            r = await _attempt(http, kind, i, cfg)
        except Exception as e:  # noqa: BLE001 - every way a request can go wrong is counted
            out.failures[f"{kind}: {type(e).__name__}"] += 1
            out.counts["failed"] += 1
            continue
        dt = time.monotonic() - t0
        if r.status_code == 200:
            out.counts["completed"] += 1
            out.counts[f"completed_{kind}"] += 1
            out.ok_latency.append(dt)
        elif r.status_code == 429:
            out.counts["refused_429"] += 1
            out.refused_latency.append(dt)
            await asyncio.sleep(
                min(float(r.headers.get("retry-after", "1")), cfg.max_backoff_s)
                * (0.5 + (i % 10) / 20)
            )
        else:
            out.counts["failed"] += 1
            out.failures[f"{kind}: HTTP {r.status_code}"] += 1


async def _settle(http: httpx.AsyncClient, limit_s: float) -> dict:
    """Poll the server's books until nothing is owed anywhere (bounded)."""
    t0 = time.monotonic()
    while True:
        serve, stats = (await http.get("/v1/serve")).json(), (await http.get("/v1/stats")).json()
        books = {
            "open_requests": serve["open_requests"],
            "broker_pending": stats["broker"]["pending"],
            "engine_in_flight": sum(e["in_flight"] for e in stats["engines"]),
            "kv_blocks_reserved": sum(e["kv_blocks_reserved"] for e in stats["engines"]),
            "gate_active": sum(g["active"] for g in serve["endpoints"].values()),
        }
        if not any(books.values()) or time.monotonic() - t0 > limit_s:
            return {
                "settled": not any(books.values()),
                "settle_s": round(time.monotonic() - t0, 2),
                **books,
                "abandoned": serve["abandoned"],
                "engine_cancelled": sum(e["requests_cancelled"] for e in stats["engines"]),
                "refused_by_gates": sum(g["refused"] for g in serve["endpoints"].values()),
                "endpoints": serve["endpoints"],
            }
        await asyncio.sleep(0.2)


async def run(url: str, cfg: LoadConfig) -> dict:
    headers = {"authorization": f"Bearer {cfg.token}"} if cfg.token else {}
    tls = ssl.create_default_context()

    def client() -> httpx.AsyncClient:
        # One small client per simulated user, like separate users. httpx's pool scans its
        # connections linearly, so one shared pool of thousands would slow the load generator far
        # more than the server; and each client would build its own TLS context (~20 ms) unless
        # given this shared one.
        return httpx.AsyncClient(
            base_url=url,
            headers=headers,
            limits=httpx.Limits(max_connections=2),
            verify=tls,
            timeout=httpx.Timeout(cfg.time_limit_s, connect=30.0),
        )

    async def user(i: int) -> None:
        async with client() as http:
            await _client(i, http, cfg, out, functions)

    async with client() as http:
        functions = "classify" in (await http.get("/v1/serve")).json()["functions"]
        out = Outcomes()
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(user(i)) for i in range(cfg.clients)]
        done, hung = await asyncio.wait(tasks, timeout=cfg.time_limit_s)
        for t in hung:
            t.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        wall = time.monotonic() - t0
        crashed = sum(1 for t in done if t.exception() is not None)
        books = await _settle(http, cfg.settle_limit_s)
    c = out.counts
    return {
        "config": asdict(cfg) | {"token": bool(cfg.token)},
        "wall_s": round(wall, 2),
        "clients_hung": len(hung),
        "clients_crashed": crashed,
        "attempts": c["attempts"],
        "completed": c["completed"],
        "refused_429": c["refused_429"],
        "failed": c["failed"],
        "disconnected": c["disconnected"],
        "refused_429_before_disconnect": c["refused_429_before_disconnect"],
        "completed_by_kind": {
            k[len("completed_") :]: v for k, v in c.items() if k.startswith("completed_")
        },
        "failures": dict(out.failures),
        "latency_ok": percentiles(out.ok_latency),
        "latency_429": percentiles(out.refused_latency),
        "completed_per_s": round(c["completed"] / wall, 1) if wall else 0.0,
        "server_books": books,
    }


def spawn_server(*extra: str, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """`forge serve functions/classify.py` on the embedded node, any free port; returns (process, URL)."""
    ready = os.path.join(tempfile.mkdtemp(prefix="forge-load-"), "url")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "serve",
            "functions/classify.py",
            "--port",
            "0",
            "--ready-file",
            ready,
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout_s
    while not (os.path.exists(ready) and open(ready).read().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(
                f"forge serve did not come up: {proc.stderr.read().decode()[-2000:]}"
            )
        time.sleep(0.2)
    return proc, open(ready).read().strip()


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url")
    where.add_argument("--spawn", action="store_true", help="start forge serve on the embedded "
                                                            "node for the run")
    for name, default in asdict(LoadConfig()).items():
        if name != "token":
            ap.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    args = ap.parse_args(argv)
    cfg = LoadConfig(**{k: getattr(args, k) for k in asdict(LoadConfig()) if k != "token"},
                     token=os.environ.get("FORGE_TOKEN"))
    # one address holds up to 2 connections per simulated client: let it (the server bounds one
    # address by default)
    proc, url = (
        spawn_server("--max-connections-per-client", str(2 * cfg.clients + 64))
        if args.spawn
        else (None, args.url)
    )
    try:
        report = asyncio.run(run(url, cfg))
    finally:
        if proc is not None:
            code = stop_server(proc)
    if proc is not None:
        report["server_exit_code"] = code
    print(json.dumps(report, indent=2))
    ok = (
        not report["clients_hung"]
        and not report["clients_crashed"]
        and report["server_books"]["settled"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
