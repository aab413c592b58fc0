"""Which node already provisioned on this machine a `forge run` may use instead of provisioning its own.

Why. A `forge run` provisions its node in its own process: on the 2-core machine a 100-record job spent ~4 s
bringing the card up (importing torch and transformers alone takes ~3 s) for 3-4 s of work (docs/benchmarks.md,
"Start-up"). With the same node already up (`forge provision local`, once), the run uses it, as Modal reuses
a warm container, and the whole command takes the job's time and half a second.

When. Only a node that is exactly what this run would provision: the same name, started by this user from this
checkout, from a description and contracts whose content (every field, the artifacts' resolved paths) is the
same as what this run loaded (`description_digest`), and that answers its /health. Anything else is said in one
line and the run provisions its own node, as it always did; `--fresh-node` asks for that outright."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

DIGEST_KEY = "description_digest"      # the registry entry's field: written by `forge provision`
HEALTH_TIMEOUT_S = 2.0                 # a warm node answers its /health in milliseconds; a stuck one not at all


def _section(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def description_digest(loaded) -> str:
    """A digest of what a node description provisions: the node and each of its contracts, every field, with the
    contracts' artifact paths resolved (two copies of one file in different folders name different models)."""
    contracts = {}
    for name, c in sorted(loaded.contracts.items()):
        art = c.artifact
        contracts[name] = {"fields": c.model_dump(mode="json"),
                           "sections": {k: _section(v) for k, v in sorted(c.sections.items())},
                           "paths": [str(c.resolve(p)) for p in (art.engine_dir, art.checkpoint, art.tokenizer)]}
    # the node's `contracts:` names files, whose content is above: a copy of the description elsewhere (the
    # packaged `local` and node_descriptions/local.yaml) that reaches the same contracts is the same node
    node = loaded.node.model_dump(mode="json", exclude={"contracts"})
    text = json.dumps({"node": node, "contracts": contracts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def find(loaded) -> tuple[Optional[dict], Optional[str]]:
    """(the registry entry of a warm node this run may use, None) or (None, why a node of that name is up but
    not used: one line), or (None, None) when no node of that name is up."""
    from forge.runtime import registry

    name = loaded.node.node
    entry = next((n for n in registry.nodes() if n["node"] == name), None)
    if entry is None:
        return None, None
    head = f"node {name!r} is up (pid {entry.get('pid')})"
    other = registry.whose(entry)
    if other is not None:
        return None, f"{head} but is {other}: provisioning one in this process"
    if entry.get(DIGEST_KEY) != description_digest(loaded):
        return None, (f"{head} from another description, or from this one before it or its contracts changed: "
                      "provisioning one in this process")
    if not answers(entry["control_url"]):
        return None, f"{head} but does not answer at {entry['control_url']}: provisioning one in this process"
    return entry, None


def answers(url: str) -> bool:
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return True
