"""Nodes provisioned on this machine, as state files under $FORGE_HOME/nodes (default ~/.forge).

A node's name is its identity on the machine: `claim(name)` takes an exclusive flock on `NAME.lock`
for the life of the provisioning process, before any engine loads, so a second node of the same name
is refused at once. The OS drops the lock when the process ends however it ends (kill -9 included),
so liveness is the lock, not the pid (which the OS reuses): an entry whose lock is free belongs to a
dead process and is removed the next time anyone reads the registry. `unregister` only ever removes
this process's own entry.

Every entry records whose it is: the user (uid) and the checkout (the folder forge was imported
from) that started it. On a machine shared by several users or several checkouts of forge, `forge
status` marks the nodes that are not this checkout's, and a command that picks a node by itself
(`forge deploy` without `--node`) never picks one of them: it names them and says how to choose one.
$FORGE_HOME keeps one's nodes apart altogether.

What is believed of the folder and its files (this user's, writable by no one else, of the shape
written here) is forge/machine/registry_files.py's; a node proves it is the node its entry names
before anything is sent to it (forge/machine/node_proof.py, with the key `register` writes beside
the entry, readable by this user alone)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Optional

from forge.errors import ForgeError, UsageError
from forge.machine import registry_files as files
from forge.machine.registry_files import check_name, home  # noqa: F401 - home: forge.cluster reads it from here

_claims: dict[str, int] = {}      # name -> fd of NAME.lock, held by this process


def origin() -> dict:
    """Who starts a node from this process: the user and the checkout of forge it runs."""
    import forge

    try:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        user = str(os.getuid())
    return {
        "uid": os.getuid(),
        "user": user,
        "checkout": str(Path(forge.__file__).resolve().parent.parent),
    }


def whose(entry: dict) -> Optional[str]:
    """None for a node this user started from this checkout; else what it is, in a few words."""
    mine = origin()
    if "uid" not in entry or "checkout" not in entry:
        return "origin unknown (an older forge started it)"
    if entry["uid"] != mine["uid"]:
        return f"user {entry.get('user') or entry['uid']}'s"
    if entry["checkout"] != mine["checkout"]:
        return f"from another checkout, {entry['checkout']}"
    return None


def _read(dfd: int, name: str) -> Optional[dict]:
    """NAME's entry, if forge believes it (else None, said once)."""
    return next(
        (info for filename, info in files.read_entries(dfd) if filename == f"{name}.json"), None
    )


def _lock_held(dfd: int, name: str) -> Optional[bool]:
    """Whether a live process holds NAME.lock; None when there is no lock file (an entry of an older
    forge)."""
    if name in _claims:
        return True
    try:
        fd = os.open(
            f"{name}.lock", os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
        )
    except FileNotFoundError:
        return None
    except OSError:             # not a file forge made: no live node of forge's holds it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)              # closing drops the probe's lock, if it got one
    return False


def claim(name: str) -> None:
    """Take `name` on this machine for this process's life; refuse it, in one line, while another
    holds it."""
    check_name(name)
    if name in _claims:
        return
    with files.opened_folder() as dfd:
        try:
            fd = os.open(
                f"{name}.lock",
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dfd,
            )
        except OSError as e:
            raise ForgeError(f"{files.folder() / (name + '.lock')}: cannot open the node's lock: "
                             f"{e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            info = _read(dfd, name) or {}
            _refuse_taken(name, info)
    _claims[name] = fd


def _refuse_taken(name: str, info: dict) -> None:
    """A node of that name holds its lock: say which, and how to keep one's nodes apart."""
    where = ", ".join(f"{k} {info[v]}" for k, v in (("pid", "pid"), ("control", "control_url"),
                                                      ("from", "source")) if info.get(v))
    theirs = whose(info) if info else None
    apart = (f"; it is {theirs}: set FORGE_HOME to a folder of your own to keep your nodes apart "
             "(now "
             f"{home()})") if theirs else ""
    raise ForgeError(f"a node named {name!r} is already provisioned on this machine"
                     f"{f' ({where})' if where else ''}: stop it first, or give this node another "
                     "name "
                     f"(its description's `node:`){apart}") from None


def release(name: str) -> None:
    fd = _claims.pop(name, None)
    if fd is not None:
        os.close(fd)


def register(name: str, info: dict, key: Optional[str] = None) -> Path:
    """Write this process's entry for `name` (and first its key, readable by this user alone: what
    its node proves itself with, forge/machine/node_proof.py)."""
    claim(name)
    with files.opened_folder() as dfd:
        if key is not None:
            files.write_private(dfd, f"{name}.key", key.encode("ascii"))
        entry = {**info, **origin(), "node": name, "pid": os.getpid()}
        files.write_private(
            dfd, f"{name}.json", json.dumps(entry, indent=2, allow_nan=False).encode()
        )
    return files.folder() / f"{name}.json"


def _remove(dfd: int, name: str) -> None:
    for suffix in (".json", ".key"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{name}{suffix}", dir_fd=dfd)


def unregister(name: str) -> None:
    """Remove this process's entry for `name` (never another process's) and give the name back."""
    with files.opened_folder() as dfd:
        info = _read(dfd, check_name(name))
        if info is not None and info.get("pid") == os.getpid():
            _remove(dfd, name)
    release(name)


def key_of(name: str) -> tuple[Optional[str], Optional[str]]:
    """(NAME's key, None) or (None, why forge has none it believes)."""
    with files.opened_folder() as dfd:
        return files.read_key(dfd, name)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def entries() -> list[dict]:
    """Every entry forge believes (forge/machine/registry_files.py), each with "alive"; entries of
    processes that are gone are removed from disk (the registry heals itself) but still returned
    once, so `forge status` can say what happened."""
    out = []
    with files.opened_folder() as dfd:
        for _, info in files.read_entries(dfd):
            held = _lock_held(dfd, info["node"])
            alive = held if held is not None else pid_alive(info["pid"])
            if not alive:
                _remove(dfd, info["node"])
            out.append({**info, "alive": alive})
    return out


def nodes() -> list[dict]:
    """Live entries only (dead ones are cleaned up)."""
    return [{k: v for k, v in e.items() if k != "alive"} for e in entries() if e["alive"]]


def resolve(target: Optional[str]) -> dict:
    """A node by name or URL; with none given, the one node provisioned here."""
    if target and target.startswith(("http://", "https://")):
        return {"node": target, "control_url": target}
    found = entries()
    live = [e for e in found if e["alive"]]
    running = ", ".join(n["node"] for n in live) or "none"
    if target:
        for n in live:
            if n["node"] == target:
                return n
        for n in found:
            if n["node"] == target:
                raise ForgeError(f"node {target!r} is not running: its process (pid "
                                 f"{n.get('pid')}) ended without "
                                 f"stopping it (its entry is now removed); start it again with "
                                 f"`forge provision {n.get('source') or 'NODE.yaml'}`")
        raise ForgeError(f"no node named {target!r} is provisioned on this machine (running: "
                         f"{running}); "
                         "`forge provision NODE.yaml` starts one, or pass its URL")
    if not live:
        dead = [n["node"] for n in found]
        gone = f" ({', '.join(dead)} ended without stopping; entry removed)" if dead else ""
        raise ForgeError(f"no node is provisioned on this machine{gone}: run `forge provision "
                         "NODE.yaml` first, "
                         "or pass --node URL")
    # Picked without being named: only a node this user started from this checkout (another's may
    # run another model, or be stopped by its owner mid-job).
    mine = [n for n in live if whose(n) is None]
    if len(mine) == 1:
        return mine[0]
    if mine:
        raise UsageError("several nodes are provisioned from this checkout "
                         f"({', '.join(n['node'] for n in mine)}): "
                         "pick one with --node")
    others = "; ".join(f"{n['node']} ({whose(n)})" for n in live)
    raise UsageError(f"no node started from this checkout ({origin()['checkout']}) is provisioned; "
                     "running here: "
                     f"{others}: pass --node NAME to use one of them, or `forge provision "
                     "NODE.yaml` to start "
                     "your own")
