"""Nodes provisioned on this machine, as state files under $FORGE_HOME/nodes (default ~/.forge)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from forge.errors import UsageError


def home() -> Path:
    return Path(os.environ.get("FORGE_HOME", Path.home() / ".forge"))


def _dir() -> Path:
    d = home() / "nodes"
    d.mkdir(parents=True, exist_ok=True)
    return d


def register(name: str, info: dict) -> Path:
    path = _dir() / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**info, "node": name, "pid": os.getpid()}, indent=2))
    os.replace(tmp, path)
    return path


def unregister(name: str) -> None:
    try:
        (_dir() / f"{name}.json").unlink()
    except FileNotFoundError:
        pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def nodes() -> list[dict]:
    """Live entries only; files of processes that died without cleaning up are removed."""
    out = []
    for f in sorted(_dir().glob("*.json")):
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(int(info.get("pid", -1))):
            out.append(info)
        else:
            f.unlink(missing_ok=True)
    return out


def resolve(target: Optional[str]) -> dict:
    """A node by name or URL; with none given, the one node provisioned here."""
    if target and target.startswith(("http://", "https://")):
        return {"node": target, "control_url": target}
    live = nodes()
    if target:
        for n in live:
            if n["node"] == target:
                return n
        raise UsageError(f"no provisioned node named {target!r} on this machine "
                         f"(running: {', '.join(n['node'] for n in live) or 'none'}); give its URL instead")
    if len(live) == 1:
        return live[0]
    if not live:
        raise UsageError("no node is provisioned on this machine: run `forge provision NODE.yaml` first, "
                         "or pass --node URL")
    raise UsageError(f"several nodes are provisioned ({', '.join(n['node'] for n in live)}): pick one with --node")
