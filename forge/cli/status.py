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
    @click.option("--wide", is_flag=True, help="every column, whatever the terminal's width (the "
                                               "default fits "
                  "the terminal, 80 columns at least)")
    def status_cmd(as_json: bool, token_env: str, cluster, wide: bool):
        """Show provisioned nodes: cards, tiers, health, in flight, generated tokens/s."""
        import httpx

        from forge.cli import screen
        from forge.machine import registry
        from forge.machine.warm_node import proven

        if cluster is not None:
            return _cluster_status(cluster, as_json, wide)
        token = os.environ.get(token_env)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        rows = []
        for info in registry.entries():
            if not info.pop("alive"):
                desc = {"error": "dead", "why": "the process ended without stopping the node "
                                                "(killed?); its "
                        "entry is removed now"}
            # no token goes to a server that did not prove it is the node
            elif (why := proven(info)) is not None:
                desc = {"error": "unproven", "why": why}
            else:
                try:
                    r = httpx.get(info["control_url"] + "/v1/node", headers=headers, timeout=3.0)
                    desc = r.json() if r.status_code == 200 else {"error": f"HTTP {r.status_code}"}
                except httpx.HTTPError as e:
                    desc = {"error": "no answer", "why": "it does not answer "
                                                         f"({type(e).__name__}): stopped or "
                            f"stuck; `kill {info.get('pid')}` ends it"}
            rows.append({**info, "whose": registry.whose(info), "live": desc})
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return 0
        if not rows:
            click.echo("no nodes provisioned on this machine (forge provision NODE.yaml)")
            return 0
        # The URL is what a user copies: it goes on a line of its own, never into a column that 80
        # columns cut.
        console = screen.console(wide)
        console.print(
            screen.fitting(
                console, _node_table(rows, compact=False), lambda: _node_table(rows, compact=True)
            )
        )
        for n in rows:
            where = "" if n["live"].get("error") == "dead" else f" {n['control_url']}"
            why = f" — {n['live']['why']}" if "why" in n["live"] else ""
            theirs = f" — * not this checkout's: {n['whose']}" if n["whose"] else ""
            click.echo(f"{n['node']}: pid {n.get('pid')}{where}{why}{theirs}")
        return 0


def idle_reads_zero(card: dict) -> float:
    """A card's generated tokens/s as status shows it: the runtime's rate (an EWMA that only moves
    while work is in flight) while it has work in flight; 0 when it has none, as `forge top` reads
    an idle card. Generated tokens only, as engines and their benchmarks count tok/s (the runtime's
    prompt + generated rate is the broker's balancing signal, in /v1/node as tokens_per_s)."""
    return float(card.get("output_tokens_per_s") or 0.0) if card.get("in_flight") else 0.0


def _node_table(rows: list[dict], *, compact: bool):
    from rich import box
    from rich.table import Table

    table = Table(
        title="forge nodes",
        title_justify="left",
        box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
        pad_edge=not compact,
    )
    cols = ("node", "card", "tier", "health", "in flight", "gen tok/s") if compact else \
        ("node", "card", "tier", "backend", "health", "in flight", "generated tok/s")
    for col in cols:
        table.add_column(
            col, justify="right" if col in ("in flight", "gen tok/s", "generated tok/s") else "left"
        )
    for n in rows:
        live = n["live"]
        # Another user's or another checkout's node is marked where its name is: it is not this
        # checkout's to deploy to without naming it (the line below the table says whose).
        name = n["node"] + ("" if n["whose"] is None else " *")
        if "error" in live:
            table.add_row(name, "-", "-", *(() if compact else ("-",)), live["error"], "-", "-")
            continue
        for c in live["cards"]:
            table.add_row(
                name,
                c["card"],
                c["tier"],
                *(() if compact else (c["backend"],)),
                "ok" if c["healthy"] else "DOWN",
                str(c["in_flight"]),
                f"{idle_reads_zero(c):,.0f}",
            )
    return table


def _cluster_status(address: str, as_json: bool, wide: bool = False) -> int:
    """Nodes, cards, tiers and health of every forge node on a Ray cluster."""
    from rich import box
    from rich.table import Table

    from forge.cli import screen
    from forge.cluster.status import cluster_status

    rows = cluster_status(address)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        click.echo(f"no forge node on the Ray cluster at {address} (forge provision NODE.yaml "
                   f"--cluster {address})")
        return 0
    def build(compact: bool) -> Table:
        table = Table(title=f"forge nodes on the Ray cluster at {address}", title_justify="left",
                      box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, pad_edge=not compact)
        cols = (
            ("node", "host", "card", "tier", "health", "in flight", "gen tok/s")
            if compact
            else (
                "node",
                "host",
                "state",
                "card",
                "model",
                "tier",
                "backend",
                "health",
                "in flight",
                "generated tok/s",
            )
        )
        for col in cols:
            table.add_column(
                col,
                justify="right" if col in ("in flight", "gen tok/s", "generated tok/s") else "left",
            )
        for n in rows:
            head = (n["node"], str(n.get("host", "-"))) + (
                () if compact else (n.get("state", "-"),)
            )
            if not n.get("cards"):
                table.add_row(*head, *["-"] * (len(cols) - len(head)))
                continue
            for c in n["cards"]:
                health = "ok" if c.get("healthy") else c.get("state", "DOWN").upper()
                rest = (
                    (c["card"], c["tier"])
                    if compact
                    else (c["card"], c["model"], c["tier"], c["backend"])
                )
                table.add_row(
                    *head, *rest, health, str(c.get("in_flight", "-")), f"{idle_reads_zero(c):,.0f}"
                )
                head = ("",) * len(head)
        return table

    console = screen.console(wide)
    console.print(screen.fitting(console, build(False), lambda: build(True)))
    return 0
