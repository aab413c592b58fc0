"""One huge prompt against `forge serve` on the embedded node, while a second client polls /health: how long the
refusal takes, the worst /health latency meanwhile, and the server's peak RSS (issue 13, item 5).

    PYTHONPATH=. python docs/bench/cpu/huge_prompt.py [--mb 30]
"""
from __future__ import annotations

import argparse
import threading
import time

import httpx

from forge.serve.loadtest import spawn_server, stop_server


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=30)
    args = ap.parse_args()
    proc, url = spawn_server()
    before = peak_rss_mib(proc.pid)
    out: dict = {}

    def huge() -> None:
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", timeout=600, json={
            "model": "tiny-llama-cpu", "prompt": "hello world " * (args.mb * 2**20 // 12), "max_tokens": 2})
        out.update(status=r.status_code, seconds=round(time.monotonic() - t0, 2))

    thread = threading.Thread(target=huge)
    thread.start()
    worst = 0.0
    while thread.is_alive():
        t0 = time.monotonic()
        httpx.get(url + "/health", timeout=600)
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.01)
    print({**out, "worst_health_s": round(worst, 3), "peak_rss_mib_before": round(before),
           "peak_rss_mib_after": round(peak_rss_mib(proc.pid)), "server_exit": stop_server(proc)})


if __name__ == "__main__":
    main()
