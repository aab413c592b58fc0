"""`forge status`: the nodes provisioned on this machine, their cards, tiers and health."""
from __future__ import annotations

import json
import os

import click


def register(cli: click.Group) -> None:
    @cli.command("status")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    @click.option("--token-env", default="FORGE_TOKEN", show_default=True)
    @click.option("--cluster", default=None, metavar="ADDRESS",
                  help="the forge nodes provisioned on this Ray cluster (see docs/cluster.md)")
    def status_cmd(as_json: bool, token_env: str, cluster):
        """Show provisioned nodes: cards, tiers, health, in flight, tokens/s."""
        import httpx
        from rich.console import Console
        from rich.table import Table

        from forge.runtime import registry

        if cluster is not None:
            return _cluster_status(cluster, as_json)
        token = os.environ.get(token_env)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        rows = []
        for info in registry.nodes():
            try:
                r = httpx.get(info["control_url"] + "/v1/node", headers=headers, timeout=3.0)
                desc = r.json() if r.status_code == 200 else {"error": f"HTTP {r.status_code}"}
            except httpx.HTTPError as e:
                desc = {"error": f"unreachable: {e}"}
            rows.append({**info, "live": desc})
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return 0
        if not rows:
            click.echo("no nodes provisioned on this machine (forge provision NODE.yaml)")
            return 0
        table = Table(title="forge nodes")
        for col in ("node", "pid", "control", "card", "tier", "backend", "health", "in flight", "tok/s"):
            table.add_column(col)
        for n in rows:
            live = n["live"]
            if "error" in live:
                table.add_row(n["node"], str(n["pid"]), n["control_url"], "-", "-", "-", live["error"], "-", "-")
                continue
            for c in live["cards"]:
                table.add_row(n["node"], str(n["pid"]), n["control_url"], c["card"], c["tier"], c["backend"],
                              "ok" if c["healthy"] else "DOWN", str(c["in_flight"]), f"{c['tokens_per_s']:,.0f}")
        Console().print(table)
        return 0


def _cluster_status(address: str, as_json: bool) -> int:
    """Nodes, cards, tiers and health of every forge node on a Ray cluster."""
    from rich.console import Console
    from rich.table import Table

    from forge.cluster.status import cluster_status

    rows = cluster_status(address)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        click.echo(f"no forge node on the Ray cluster at {address} (forge provision NODE.yaml --cluster {address})")
        return 0
    table = Table(title=f"forge nodes on the Ray cluster at {address}")
    for col in ("node", "host", "state", "card", "model", "tier", "backend", "health", "in flight", "tok/s"):
        table.add_column(col)
    for n in rows:
        head = (n["node"], str(n.get("host", "-")), n.get("state", "-"))
        if not n.get("cards"):
            table.add_row(*head, "-", "-", "-", "-", "-", "-", "-")
            continue
        for c in n["cards"]:
            health = "ok" if c.get("healthy") else c.get("state", "DOWN").upper()
            table.add_row(*head, c["card"], c["model"], c["tier"], c["backend"], health,
                          str(c.get("in_flight", "-")), f"{c.get('tokens_per_s', 0):,.0f}")
            head = ("", "", "")
    Console().print(table)
    return 0
