"""This machine's Ray node, as the node agent sees it: started by the agent (the default) or already
there.

Started: `ray start --address ADDRESS --resources {forge resources} --num-gpus 0 --block` as the
agent's child, under PR_SET_PDEATHSIG(SIGTERM). `ray start --block` shares its fate with the raylet
it starts, so the chain agent -> ray start -> raylet -> engine actors (guard.py) ends when the agent
ends, however it ends. Existing: a Ray node someone else started with the forge resources (`forge
provision --dry-run --cluster` prints them); the agent only attaches to it and leaves it running
when it exits."""
from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from forge.cluster.names import forge_node_of, node_resource
from forge.errors import ForgeError

NODE_APPEAR_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
EXTRA_ARGS_ENV = "FORGE_RAY_START_ARGS"      # extra `ray start` arguments, shell-quoted


def _die_with_parent_sigterm() -> None:        # runs in the child, before exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


class RayNodeProcess:
    """`ray start --block` for this machine, a child of the agent."""

    def __init__(self, address: str, resources: dict[str, float], cpu_cores: int, log_path: Path):
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", address,
                "--resources", json.dumps(resources, sort_keys=True), "--num-cpus", str(cpu_cores),
                "--num-gpus", "0", "--disable-usage-stats", "--block"]
        args += shlex.split(os.environ.get(EXTRA_ARGS_ENV, ""))
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent_sigterm,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-5:]
        except OSError:
            tail = []
        return (
            f"`ray start` exited with code {self.proc.returncode}"
            + (": " + " | ".join(line.strip() for line in tail) if tail else "")
            + f" (log: {self.log_path})"
        )

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def forge_ray_nodes(ray) -> dict[str, list[dict]]:
    """Alive Ray nodes that advertise a forge node, by forge node name."""
    out: dict[str, list[dict]] = {}
    for n in ray.nodes():
        name = forge_node_of(n.get("Resources", {})) if n.get("Alive") else None
        if name:
            out.setdefault(name, []).append(n)
    return out


def wait_for_node(ray, node: str, needs: dict[str, float], proc: Optional[RayNodeProcess],
                  timeout_s: float = NODE_APPEAR_TIMEOUT_S) -> str:
    """The Ray node id advertising `node`, once it is alive with every resource the description
    needs."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = forge_ray_nodes(ray).get(node, [])
        if len(found) > 1:
            raise ForgeError(f"{len(found)} Ray nodes advertise {node_resource(node)} "
                             f"({', '.join(n['NodeManagerAddress'] for n in found)}): node names "
                             "must be unique")
        if found:
            have = found[0]["Resources"]
            short = {k: v for k, v in needs.items() if have.get(k, 0.0) < v}
            if short:
                raise ForgeError(
                    f"the Ray node advertising {node_resource(node)} lacks "
                    + ", ".join(
                        f"{k}={v:g} (has {have.get(k, 0.0):g})" for k, v in sorted(short.items())
                    )
                    + "; start it with --resources "
                    f"'{json.dumps(needs, sort_keys=True)}'"
                )
            return found[0]["NodeID"]
        if proc is not None and not proc.alive():
            raise ForgeError(proc.failure())
        if time.monotonic() > deadline:
            hint = ("it did not join" if proc is not None else
                    "start it first: ray start --address ... --resources "
                    f"'{json.dumps(needs, sort_keys=True)}'")
            raise ForgeError(f"no Ray node advertising {node_resource(node)} appeared within "
                             f"{timeout_s:g} s; {hint}")
        time.sleep(0.25)


def node_alive(ray, node_id: str) -> bool:
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())
