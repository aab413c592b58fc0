"""`forge serve FILE.py[:NAME] ... --node NODE.yaml`: functions as HTTP endpoints, plus
OpenAI-compatible completions, on a node provisioned in this process (docs/serve.md)."""
from __future__ import annotations

import os
from typing import Optional

import click

from forge.cli.node_arg import HELP_DESCRIPTION
from forge.errors import UsageError


def register(cli: click.Group) -> None:
    @cli.command("serve")
    @click.argument("targets", nargs=-1, metavar="[FILE.py[:NAME]]...")
    @click.option("--node", "node_arg", default=None, metavar="NODE", help=HELP_DESCRIPTION)
    @click.option("--remote", default=None, metavar="NODE",
                  help="serve against a node provisioned with `forge provision` instead of "
                       "provisioning one here: "
                  "its name on this machine, its control URL, or the path of its description")
    @click.option("--node-token-env", default="FORGE_TOKEN", show_default=True,
                  help="with --remote: environment variable holding the remote node's bearer token")
    @click.option("--host", default="127.0.0.1", show_default=True,
                  help="address to listen on; off loopback a bearer token is required")
    @click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=8471,
        show_default=True,
        help="0: any free port",
    )
    @click.option("--token-env", default="FORGE_TOKEN", show_default=True,
                  help="environment variable holding the bearer token clients must send")
    @click.option(
        "--max-concurrency",
        type=click.IntRange(1, 1_000_000),
        default=None,
        help="requests in progress per endpoint before 429; default: 2 x the node's slots",
    )
    @click.option(
        "--deadline-s",
        type=click.FloatRange(0.001, 600),
        default=60.0,
        show_default=True,
        help="a request's deadline when it names none (X-Forge-Deadline header / deadline_s field)",
    )
    @click.option(
        "--max-body-mb",
        type=click.FloatRange(0.001, 4096),
        default=32.0,
        show_default=True,
        help="largest request body accepted; a bigger one gets 413",
    )
    @click.option("--max-connections-per-client", type=click.IntRange(0, 1_000_000), default=1024,
                  show_default=True, help="open connections per client address (0: no bound); at "
                                          "the bound a new "
                  "connection closes that address's oldest idle one")
    @click.option("--strict", is_flag=True, help="treat validation warnings as errors")
    @click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
                  help="write the server's URL to this file once it accepts requests")
    def serve_cmd(
        targets,
        node_arg,
        remote,
        node_token_env,
        host,
        port,
        token_env,
        max_concurrency,
        deadline_s,
        max_body_mb,
        max_connections_per_client,
        strict,
        ready_file,
    ) -> int:
        """Serve functions (one POST /v1/functions/NAME each) and OpenAI-compatible /v1/completions
        and /v1/chat/completions, with an OpenAPI document at /docs."""
        from forge.cli.node_arg import description_path, provisioned
        from forge.config.load import load_node
        from forge.functions.loader import load_function
        from forge.node.endpoint import require_token
        from forge.serve.app import ServeOptions, serve_embedded

        from forge.serve.app import serve_remote

        if remote is not None and node_arg is not None:
            raise UsageError("give --node (provision here) or --remote (a node provisioned "
                             "elsewhere), not both")
        token: Optional[str] = os.environ.get(token_env) or None
        require_token(host, token, token_env, what="forge serve")
        from forge.machine.ports import check_free

        check_free(host, port, "forge serve", "--port")      # before any engine loads
        from forge.cli.interrupt import exit_at_once_until_draining

        exit_at_once_until_draining("while the node starts")
        specs = [load_function(t) for t in targets]
        opts = ServeOptions(host=host, port=port, token=token, max_concurrency=max_concurrency,
                            default_deadline_s=deadline_s, ready_file=ready_file,
                            max_body_bytes=int(max_body_mb * 2**20),
                            max_connections_per_client=max_connections_per_client)
        if remote is not None:
            return serve_remote(
                provisioned(remote)["control_url"], os.environ.get(node_token_env), specs, opts
            )
        loaded = load_node(description_path(node_arg, "serve"), strict=strict)
        for w in loaded.warnings:
            click.echo(w.render(), err=True)
        return serve_embedded(loaded, specs, opts)
