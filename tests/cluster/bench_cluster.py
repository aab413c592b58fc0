"""The cluster path's ceiling in tasks/s, with the instant engine (NO MODEL: it answers at once).

    python tests/cluster/bench_cluster.py [--records 20000] [--nodes 2]

A local Ray cluster of instant nodes (harness.py: real raylets and real node agents on 127.0.0.1)
runs:
  raw     ClusterNode.generate from one driver, N requests at once (broker -> Ray batches -> engines -> back)
  deploy  `forge deploy --cluster` over N records: the whole job path (reader, function, ledger, output)
  local   the same records with `forge run` on one instant node in one process (the single-machine path)
Prints one line per path with tasks/s; docs/cluster.md records the numbers."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests.cluster.harness import FIXTURES, REPO, LocalCluster  # noqa: E402

PROMPT_TOKENS = 8


def write_records(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps({"id": i, "ids": [3 + (i * 7 + j) % 2000 for j in range(PROMPT_TOKENS)]})
                + "\n"
            )
    return path


async def raw(address: str, n: int) -> float:
    from forge.cluster.client import ClusterNode
    from forge.functions.api import GenerateParams

    node = ClusterNode(address)
    await node.start()
    params = GenerateParams(max_tokens=1)
    prompts = [[3 + (i * 7 + j) % 2000 for j in range(PROMPT_TOKENS)] for i in range(n)]
    try:
        await asyncio.gather(*(node.generate(p, params) for p in prompts[:1000]))      # warm
        t0 = time.perf_counter()
        await asyncio.gather(*(node.generate(p, params) for p in prompts))
        return n / (time.perf_counter() - t0)
    finally:
        await node.stop()


def job_rate(cmd: list[str], output: Path, n: int) -> tuple[float, float]:
    """Records per second of the job itself (the report's wall time), and the command's whole wall
    time."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd + ["--output", str(output)], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(p.stderr[-3000:])
    summary = json.loads(output.with_name(output.name + ".report.json").read_text())["summary"]
    assert summary["records_done"] == n, summary
    return n / summary["wall_s"], wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forge-cluster-bench-"))
    data = write_records(work / "in.jsonl", a.records)
    fn = str(FIXTURES / "functions" / "ids.py")
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cores, python "
          f"{platform.python_version()}, "
          f"{a.nodes} instant node(s), {a.records} records of {PROMPT_TOKENS} prompt tokens, 1 new "
          "token", flush=True)
    lc = LocalCluster(work)
    try:
        for i in range(1, a.nodes + 1):
            lc.add(FIXTURES / "instant" / "nodes" / f"i{i}.yaml")
        lc.wait_ready()
        import ray

        ray.init(address=lc.address, log_to_driver=False)
        print(f"raw     {asyncio.run(raw(lc.address, a.records)):>9,.0f} requests/s  "
              "(ClusterNode.generate, no ledger)",
              flush=True)
        ray.shutdown()
        rate, wall = job_rate(
            [
                sys.executable,
                "-m",
                "forge",
                "deploy",
                fn,
                "--cluster",
                lc.address,
                "--input",
                str(data),
                "--progress",
                "off",
            ],
            work / "deploy.jsonl",
            a.records,
        )
        print(f"deploy  {rate:>9,.0f} tasks/s     (forge deploy --cluster, job wall {wall:.1f} s "
              "with start-up)",
              flush=True)
    finally:
        lc.shutdown()
    rate, wall = job_rate(
        [
            sys.executable,
            "-m",
            "forge",
            "run",
            fn,
            "--node",
            str(FIXTURES / "instant" / "nodes" / "i1.yaml"),
            "--input",
            str(data),
            "--progress",
            "off",
        ],
        work / "local.jsonl",
        a.records,
    )
    print(
        f"local   {rate:>9,.0f} tasks/s     (forge run, one instant node in one process)",
        flush=True,
    )


if __name__ == "__main__":
    main()
