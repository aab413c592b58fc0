"""`forge top [--node NAME|URL]`: a live view of each card of a provisioned node."""
from __future__ import annotations

import os
from typing import Optional

import click

from forge.cli.node_arg import HELP_PROVISIONED


def register(cli: click.Group) -> None:
    @cli.command("top")
    @click.option("--node", default=None, metavar="NODE", help=HELP_PROVISIONED)
    @click.option("--interval", type=click.FloatRange(0.1, 60.0), default=1.0, show_default=True,
                  help="seconds between polls of the node's /v1/stats")
    @click.option("--token-env", default="FORGE_TOKEN", show_default=True,
                  help="environment variable holding the node's bearer token")
    @click.option("--once", is_flag=True, help="print one frame (rates over one interval) to "
                                               "stdout and exit")
    @click.option("--wide", is_flag=True, help="every column, whatever the terminal's width (the "
                                               "default fits "
                  "the terminal, 80 columns at least)")
    def top_cmd(
        node: Optional[str], interval: float, token_env: str, once: bool, wide: bool
    ) -> int:
        """Live per-card view: tokens/s, budget use, slots, KV, queues, stalls, health."""
        from forge.cli import screen
        from forge.cli.node_arg import provisioned
        from forge.top.live import run_live, run_once
        from forge.top.poll import Poller

        target = provisioned(node)
        poller = Poller(
            target["control_url"],
            name=target["node"],
            token=os.environ.get(token_env) or None,
            token_env=token_env,
        )
        console = screen.console(wide)
        try:
            return (
                run_once(poller, console, interval) if once else run_live(poller, console, interval)
            )
        except KeyboardInterrupt:
            return 0                          # Ctrl-C is how a live view ends: not an error
        finally:
            poller.close()
