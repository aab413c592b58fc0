"""`forge status`: the nodes provisioned on this machine, their cards, tiers and health."""
from __future__ import annotations

import json
import os

import click


def register(cli: click.Group) -> None:
    @cli.command("status")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    @click.option("--token-env", default="FORGE_TOKEN", show_default=True,
                  help="environment variable holding the nodes' bearer token, if they need one")
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
        for info in registry.entries():
            if not info.pop("alive"):
                desc = {"error": "dead", "why": "the process ended without stopping the node (killed?); its "
                        "entry is removed now"}
            else:
                try:
                    r = httpx.get(info["control_url"] + "/v1/node", headers=headers, timeout=3.0)
                    desc = r.json() if r.status_code == 200 else {"error": f"HTTP {r.status_code}"}
                except httpx.HTTPError as e:
                    desc = {"error": "no answer", "why": f"it does not answer ({type(e).__name__}): stopped or "
                            f"stuck; `kill {info.get('pid')}` ends it"}
            rows.append({**info, "whose": registry.whose(info), "live": desc})
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return 0
        if not rows:
            click.echo("no nodes provisioned on this machine (forge provision NODE.yaml)")
            return 0
        # The URL is what a user copies: it goes on a line of its own, never into a column that 80 columns cut.
        table = Table(title="forge nodes", title_justify="left")
        for col in ("node", "card", "tier", "backend", "health", "in flight", "tok/s"):
            table.add_column(col, justify="right" if col in ("in flight", "tok/s") else "left")
        for n in rows:
            live = n["live"]
            # Another user's or another checkout's node is marked where its name is: it is not this checkout's to
            # deploy to without naming it (the line below the table says whose).
            name = n["node"] + ("" if n["whose"] is None else " *")
            if "error" in live:
                table.add_row(name, "-", "-", "-", live["error"], "-", "-")
                continue
            for c in live["cards"]:
                table.add_row(name, c["card"], c["tier"], c["backend"], "ok" if c["healthy"] else "DOWN",
                              str(c["in_flight"]), f"{c['tokens_per_s']:,.0f}")
        Console().print(table)
        for n in rows:
            where = "" if n["live"].get("error") == "dead" else f" {n['control_url']}"
            why = f" — {n['live']['why']}" if "why" in n["live"] else ""
            theirs = f" — * not this checkout's: {n['whose']}" if n["whose"] else ""
            click.echo(f"{n['node']}: pid {n.get('pid')}{where}{why}{theirs}")
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
