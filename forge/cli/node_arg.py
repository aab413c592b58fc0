"""What `--node` names, the same way for every command: a node description (a path) or a node (a
name or a URL), told apart by their shape.

- a value with a `/`, or ending in .yaml/.yml, is a path to a node description;
- a value starting with http:// or https:// is the control URL of a provisioned node;
- anything else is a name: the name of a node description shipped with forge (`local`, the embedded
  default) for the commands that provision a node in their own process (run, serve, bench,
  provision), the name of a node provisioned on this machine for the commands that use one (deploy,
  top, serve --remote).

Each command takes what it can use and, given the other kind, says which command uses it (a usage
error, exit 2). A value of the right kind that names nothing there (no such file or node, a node
that does not answer) is a refusal, exit 1, as for any other file a command names."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from forge.errors import ForgeError, UsageError

HELP_DESCRIPTION = ("the node to provision in this process: a node description (NODE.yaml) or the "
                    "name of one "
                    "shipped with forge; default: local, the embedded CPU node")
HELP_PROVISIONED = ("a node provisioned on this machine: its name, its control URL, or the path of "
                    "its "
                    "description; default: the only one running")


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def is_path(value: str) -> bool:
    return "/" in value or value.endswith((".yaml", ".yml")) or value in (".", "..")


def _provisioned(name: str) -> Optional[dict]:
    from forge.machine import registry

    return next((n for n in registry.nodes() if n["node"] == name), None)


def _hint_provisioned(name: str) -> bool:
    try:
        return _provisioned(name) is not None
    except ForgeError:  # a home whose registry is refused: no hint, the refusal below stands
        return False


def description_path(value: Optional[str], command: str) -> Path:
    """The node description a provisioning command (`forge run`, `serve`, `bench`, `provision`)
    loads."""
    from forge.embedded import PACKAGED_NODES, default_node_path

    if value is None:
        return default_node_path()
    # provision takes it as an argument
    shown = value if command == "provision" else f"--node {value}"
    if is_url(value):
        raise UsageError(f"{shown}: `forge {command}` provisions its node in this process from a "
                         "description; "
                         "to use the node provisioned at that URL, run `forge deploy --node URL`")
    path = Path(value)
    if is_path(value) or path.is_file():
        if path.is_dir():
            raise ForgeError(f"{shown}: is a folder; give the node description file (NODE.yaml)")
        if not path.is_file():
            raise ForgeError(f"{shown}: no such node description file")
        return path
    if value in PACKAGED_NODES:
        return PACKAGED_NODES[value]
    hint = ""
    if command != "provision" and _hint_provisioned(value):
        hint = (f"; a node named {value!r} is provisioned on this machine: `forge deploy --node "
                f"{value}` runs a job "
                "against it" + (", `forge serve --remote` serves it" if command == "serve" else ""))
    raise ForgeError(f"{shown}: not a file, nor a node shipped with forge "
                     f"({', '.join(sorted(PACKAGED_NODES))}); "
                     f"give a node description (NODE.yaml){hint}")


def provisioned(value: Optional[str]) -> dict:
    """The registry entry (or {"node", "control_url"} for a URL) of a node a command uses (`forge
    deploy`, `top`, `serve --remote`). A description's path means the node it describes, by its
    name."""
    from forge.machine import registry

    if value is not None and not is_url(value) and (is_path(value) or Path(value).is_file()):
        name = _node_name(Path(value))
        live = _provisioned(name)
        if live is None:
            raise ForgeError(f"--node {value}: its node {name!r} is not provisioned on this "
                             "machine; "
                             f"`forge provision {value}` starts it") from None
        return _proven(live)
    info = registry.resolve(value)
    return info if is_url(info["node"]) else _proven(info)


def _proven(entry: dict) -> dict:
    """A node picked from the registry, once it proved it is that node: only then may a token or a
    record go to it (forge/machine/node_proof.py). A URL the user gives is the user's choice, and is
    used as given."""
    from forge.machine.warm_node import proven

    # a bare GET /health: a stopped or stuck node is named as such, with what to do
    require_answer(entry)
    why = proven(entry)
    if why is not None:
        raise ForgeError(f"node {entry['node']!r} (pid {entry['pid']}) {why}: not using it; if "
                         "that is your node, "
                         f"stop it and start it again with this forge (`forge provision "
                         f"{entry.get('source') or 'NODE.yaml'}`)")
    return entry


def _node_name(path: Path) -> str:
    """The `node:` of a description, read without validating the rest (the node is already
    provisioned)."""
    import yaml

    if not path.is_file():
        raise ForgeError(f"--node {path}: no such node description file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ForgeError(
            f"--node {path}: cannot read it as a node description: {type(e).__name__}"
        ) from None
    name = doc.get("node") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise ForgeError(f"{path}::$.node: missing; --node takes a node description, a node's name "
                         "or its URL")
    return name


def require_answer(info: dict, timeout_s: float = 5.0) -> None:
    """Refuse, saying what to do, a provisioned node that does not answer its /health (before a job
    opens its output). A node that answers, even 'degraded' or with 401, is left to the job to
    judge."""
    import httpx

    url = info["control_url"]
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if "pid" in info:
            raise ForgeError(f"node {info['node']!r} (pid {info['pid']}) does not answer at {url} "
                             f"({why}): it is "
                             f"stopped or stuck; `forge status` shows it, `kill {info['pid']}` "
                             "ends it, then "
                             f"`forge provision {info.get('source') or 'NODE.yaml'}` starts it "
                             "again") from None
        raise ForgeError(f"the node at {url} does not answer ({why}): is `forge provision` running "
                         "there, "
                         "on that port?") from None
