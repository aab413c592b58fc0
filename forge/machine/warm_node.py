"""Which node already provisioned on this machine a `forge run` may use instead of provisioning its
own.

Why. A `forge run` provisions its node in its own process: on the 2-core machine a 100-record job
spent ~4 s bringing the card up (importing torch and transformers alone takes ~3 s) for 3-4 s of
work (docs/benchmarks.md, "Start-up"). With the same node already up (`forge provision local`,
once), the run uses it, as Modal reuses a warm container, and the whole command takes the job's time
and half a second.

When. Only a node that is what this run would provision: the same name, started by this user from
this checkout, with the same `digest` (below), its cards in worker processes (the run's default),
its control URL on loopback, proving it is that node (forge/machine/node_proof.py: nothing, token
included, is sent to it before), answering /health "ok" and taking this run's token. Only entries
forge believes are read (forge/machine/registry_files.py). Anything else is said in one line and the
run provisions its own node, as it always did; `--fresh-node` asks for that outright. What a warm
node cannot give a run: a node of its own (other jobs on it share its cards, and its counters), and
a fresh start of worker restarts spent by earlier jobs."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from forge.machine import node_proof

DIGEST_KEY = "description_digest"      # the registry entry's fields: written by `forge provision`
TRANSPORT_KEY = "card_transport"
HEALTH_TIMEOUT_S = 2.0                 # a warm node answers in milliseconds; a stuck one not at all
# The environment a node's processes read their settings from (stall window, session lease, plugins,
# the engines' own variables): a run whose environment differs would have provisioned another node.
# Secrets are left out.
ENV_PREFIXES = (
    "FORGE_",
    "VLLM_",
    "CUDA_",
    "OMP_",
    "MKL_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH",
    "PYTORCH_",
    "TOKENIZERS_",
)
ENV_IGNORED = ("FORGE_HOME", "FORGE_TOKEN", "FORGE_DEBUG")


def _section(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _stamp(path: Optional[Path]) -> list:
    """A folder's or file's files by name, size and modification time: weights or a tokenizer
    rewritten in place change it (by stat, not by content: a copy that keeps both would not)."""
    try:
        if path is None or not path.exists():
            return [str(path), None]
        stats = [
            (f.name, f.stat())
            for f in ([path] if path.is_file() else sorted(path.iterdir()))
            if f.is_file()
        ]
    # unreadable or changing under us: a stamp no other state matches, never a traceback
    except OSError as e:
        return [str(path), f"unreadable: {type(e).__name__}"]
    return [str(path)] + [(name, st.st_size, st.st_mtime_ns) for name, st in stats]


def _code_stamp() -> str:
    """forge's own source as this process imported it: a node started before an edit or a pull runs
    other code."""
    import forge

    root = Path(forge.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        try:
            st = f.stat()
            h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        # a file removed while we walk: it differs from any node's stamp, as it should
        except OSError:
            h.update(f"{f.relative_to(root)}:gone\n".encode())
    return h.hexdigest()


def _environment(secret_names: set[str]) -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED and k not in secret_names}


def description_digest(loaded) -> str:
    """What a node provisioned from this process would be: the node and each of its contracts (every
    field, the artifacts' files by stat), forge's source (by stat) and the settings in the
    environment."""
    contracts = {}
    for name, c in sorted(loaded.contracts.items()):
        art = c.artifact
        contracts[name] = {
            "fields": c.model_dump(mode="json"),
            "sections": {k: _section(v) for k, v in sorted(c.sections.items())},
            "files": [
                _stamp(c.resolve(p)) for p in (art.engine_dir, art.checkpoint, art.tokenizer)
            ],
        }
    # the node's `contracts:` names files, whose content is above: a copy of the description
    # elsewhere (the packaged `local` and node_descriptions/local.yaml) that reaches the same
    # contracts is the same node
    node = loaded.node.model_dump(mode="json", exclude={"contracts"})
    text = json.dumps(
        {
            "node": node,
            "contracts": contracts,
            "code": _code_stamp(),
            "env": _environment({loaded.node.control.token_env}),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def find(loaded, token: Optional[str]) -> tuple[Optional[dict], Optional[str]]:
    """(the registry entry of a warm node this run may use, None) or (None, why a node of that name
    is up but not used: one line), or (None, None) when no node of that name is up."""
    from forge.machine import registry

    name = loaded.node.node
    entry = next((n for n in registry.nodes() if n["node"] == name), None)
    if entry is None:
        return None, None
    head = f"node {name!r} is up (pid {entry.get('pid')})"
    fresh = "provisioning one in this process"
    other = registry.whose(entry)
    if other is not None:
        return None, f"{head} but is {other}: {fresh}"
    if entry.get(DIGEST_KEY) != description_digest(loaded):
        return None, (f"{head} from another description or contracts, other model files, other "
                      "forge code or "
                      f"other FORGE_/engine environment variables: {fresh}")
    if entry.get(TRANSPORT_KEY) != "process":
        return None, f"{head} with its cards in its own process (--card-transport thread): {fresh}"
    url = entry["control_url"]
    if not node_proof.is_loopback_url(url):
        return (
            None,
            f"{head} but its registry entry's control URL {url} is not a loopback address: {fresh}",
        )
    why = proven(entry)
    if why is None:
        why = refusal(url, token)  # only now does the token go out, to the node that proved itself
    if why is not None:
        return None, f"{head} but {why}: {fresh}"
    return entry, None


def proven(entry: dict) -> Optional[str]:
    """None when the node at the entry's URL proved it is that node (forge/machine/node_proof.py);
    else why not."""
    from forge.machine import registry

    key, why = registry.key_of(entry["node"])
    if key is None:
        return f"cannot prove it is that node (its key file {why})"
    return node_proof.unproven(entry, key)


def refusal(url: str, token: Optional[str]) -> Optional[str]:
    """None when the node at `url` is healthy and takes `token`; else why not, in a few words. Ask
    it only of a node that proved itself (proven)."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.Client(
            base_url=url.rstrip("/"),
            timeout=HEALTH_TIMEOUT_S,
            follow_redirects=False,
            trust_env=False,
        ) as client:
            health = client.get("/health")
            if health.status_code != 200 or health.json().get("status") != "ok":
                return f"its /health says {health.status_code} {health.json().get('status', '')}".rstrip()
            if client.get("/v1/node", headers=headers).status_code == 401:
                return "refuses this run's token (its control.token_env)"
    except (httpx.HTTPError, ValueError, AttributeError):
        return f"does not answer at {url}"
    return None
