"""A Ray cluster of fake forge nodes on this machine, for tests and the throughput bench.

Each fake node is a real raylet (ray.cluster_utils.Cluster, 127.0.0.1) advertising the resources
`forge.cluster.names.node_resources` computes from its description, and a real node agent: `python
-m forge provision NODE.yaml --cluster ADDRESS --ray-node existing`, the command a user runs. Health
checks are tuned so a lost node is declared dead in about 1.5 s instead of 12."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

LOOPBACK_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",                 # loopback only; docs/cluster.md covers token auth
    # makes Ray keep 127.0.0.1 instead of the eth0 address
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
TUNED_HEALTH = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 500,
}
FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def use_loopback_env() -> None:
    os.environ.update(LOOPBACK_ENV)


class FakeNode:
    def __init__(
        self, name: str, path: Path, ray_node, agent: subprocess.Popen, ready: Path, log: Path
    ):
        self.name, self.path, self.ray_node, self.agent, self.ready, self.log = (
            name,
            path,
            ray_node,
            agent,
            ready,
            log,
        )

    @property
    def raylet_pid(self) -> int:
        return self.ray_node.all_processes["raylet"][0].process.pid

    def info(self) -> dict:
        return json.loads(self.ready.read_text())


class LocalCluster:
    def __init__(self, workdir: Path):
        use_loopback_env()
        from ray.cluster_utils import Cluster

        self.workdir = workdir
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "_system_config": TUNED_HEALTH,
            },
        )
        self.address = self.cluster.address
        self.nodes: dict[str, FakeNode] = {}

    def add(self, path: Path, *, wait: bool = False, num_cpus: int = 1) -> FakeNode:
        from forge.cluster.names import node_resources
        from forge.config.load import load_node

        loaded = load_node(path)
        name = loaded.node.node
        ray_node = self.cluster.add_node(
            num_cpus=num_cpus, node_ip_address="127.0.0.1", resources=node_resources(loaded)
        )
        ready = self.workdir / f"{name}.ready"
        ready.unlink(missing_ok=True)
        log = self.workdir / f"{name}.agent.log"
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "forge",
                "provision",
                str(path),
                "--cluster",
                self.address,
                "--ray-node",
                "existing",
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stdout=open(log, "ab"),
            stderr=subprocess.STDOUT,
        )
        node = self.nodes[name] = FakeNode(name, path, ray_node, agent, ready, log)
        if wait:
            self.wait_ready([node])
        return node

    def wait_ready(self, nodes: Optional[list[FakeNode]] = None, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        for node in nodes or list(self.nodes.values()):
            while not node.ready.exists():
                if node.agent.poll() is not None:
                    raise RuntimeError(f"agent {node.name} exited {node.agent.returncode}: "
                                       f"{node.log.read_text()[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"agent {node.name} not ready: "
                                       f"{node.log.read_text()[-2000:]}")
                time.sleep(0.1)

    def lose(self, name: str) -> None:
        """The machine goes away: its raylet is SIGKILLed (its engine actors die with it: the
        guard), and so is its agent."""
        node = self.nodes.pop(name)
        os.kill(node.raylet_pid, signal.SIGKILL)
        node.agent.kill()
        node.agent.wait(30)
        try:
            self.cluster.remove_node(node.ray_node, allow_graceful=False)
        except Exception:  # noqa: BLE001 - its processes are already dead
            pass

    def shutdown(self) -> None:
        import ray

        for node in self.nodes.values():
            if node.agent.poll() is None:
                node.agent.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            try:
                node.agent.wait(30)
            except subprocess.TimeoutExpired:
                node.agent.kill()
        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()
