"""`forge status --cluster ADDRESS`: every forge node on the cluster, its cards, tiers and health.

Read from the node records the agents keep (record.py), and from Ray's node table, so a Ray node
that advertises a forge node but has no agent (or an agent whose record stopped answering) shows as
such."""
from __future__ import annotations

from forge.cluster.names import NAMESPACE, NODE_RECORD_PREFIX

DESCRIBE_TIMEOUT_S = 3.0


def cluster_status(address: str) -> list[dict]:
    from forge.cluster.connect import connect, disconnect, require_ray
    from forge.cluster.raynode import forge_ray_nodes

    ray = require_ray()
    owned = connect(address)
    try:
        names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                       if a["namespace"] == NAMESPACE and a["name"].startswith(NODE_RECORD_PREFIX))
        refs = {}
        for name in names:
            try:
                refs[ray.get_actor(name, namespace=NAMESPACE).describe.remote()] = name
            except ValueError:
                continue
        ready, _ = (
            ray.wait(list(refs), num_returns=len(refs), timeout=DESCRIBE_TIMEOUT_S)
            if refs
            else ([], [])
        )
        advertised = forge_ray_nodes(ray)
        rows = []
        for ref, name in refs.items():
            node = name.removeprefix(NODE_RECORD_PREFIX)
            if ref not in ready:
                rows.append({"node": node, "state": "record not answering within "
                                                    f"{DESCRIBE_TIMEOUT_S:g} s", "cards": []})
                continue
            try:
                desc = ray.get(ref)
            except ray.exceptions.RayError as e:
                rows.append(
                    {"node": node, "state": f"record gone: {type(e).__name__}", "cards": []}
                )
                continue
            desc["ray_node_alive"] = node in advertised
            rows.append(desc)
        seen = {r["node"] for r in rows}
        for node, ray_nodes in sorted(advertised.items()):
            if node not in seen:
                rows.append(
                    {
                        "node": node,
                        "state": "no agent: the Ray node joined but no forge agent runs for it",
                        "ray_node_id": ray_nodes[0]["NodeID"],
                        "host": ray_nodes[0]["NodeManagerAddress"],
                        "cards": [],
                        "resources": {
                            k: v
                            for k, v in ray_nodes[0]["Resources"].items()
                            if k.startswith("forge_")
                        },
                    }
                )
        return sorted(rows, key=lambda r: r["node"])
    finally:
        disconnect(owned)
