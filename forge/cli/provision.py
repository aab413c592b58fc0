"""`forge provision NODE.yaml`: validate, then bring the node up (or, with --dry-run, print the
plan)."""
from __future__ import annotations

from typing import Optional

import click

from forge.cli.run import card_transport_option
from forge.errors import UsageError


def plan_table(loaded):
    """A rich Table of the per-card plan: what each card's engine will hold."""
    from rich.table import Table

    from forge.config.units import fmt_bytes

    from forge.config.plan import engine_plans
    from forge.config.working_memory import working_memory

    node = loaded.node
    engines = [p.engine_id for p in engine_plans(loaded.plans)]
    caption = ("weights, KV pool, blocks, slots and working memory are per engine; card memory: "
               "what every engine "
               "of the card holds")
    if len(engines) > len(loaded.plans):
        caption += f"; engines (one process each): {', '.join(engines)}"
    table = Table(
        title=f"node {node.node}: {len(node.cards)} card(s), {len(engines)} engine(s), "
        "host "
        f"{node.host.memory_gib:g} GiB / {node.host.cpu_cores} cores",
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    for col in ("card", "model", "engine", "backend", "replicas", "weights", "KV pool", "blocks",
                "full-length slots", "token budget", "slots", "working memory", "card memory"):
        table.add_column(
            col, justify="right" if col not in ("card", "model", "engine", "backend") else "left"
        )
    for p in loaded.plans:
        kv = p.contract.kv_cache
        working = working_memory(p)
        held = p.card_bytes + p.replicas * sum(n for _, n in working)
        table.add_row(
            p.card_id,
            p.card.model,
            p.contract.contract,
            p.contract.backend,
            str(p.replicas),
            fmt_bytes(p.weights_bytes),
            fmt_bytes(p.kv_pool_bytes),
            f"{p.num_blocks:,} x {kv.tokens_per_block}",
            f"{p.full_length_slots:,}",
            f"{p.token_budget:,}",
            f"{p.slots:,}",
            ", ".join(f"{fmt_bytes(n)} {what}" for what, n in working) or "-",
            f"{fmt_bytes(held)} of {fmt_bytes(p.card_memory_bytes)}",
        )
    return table


def compact_plan_table(loaded):
    """The plan for a terminal narrower than plan_table: the same figures, a few lines per card
    (forge/cli/screen.py)."""
    from rich.console import Group
    from rich.text import Text

    from forge.config.plan import engine_plans
    from forge.config.units import fmt_bytes
    from forge.config.working_memory import working_memory

    node = loaded.node
    engines = [p.engine_id for p in engine_plans(loaded.plans)]
    lines = [Text(f"node {node.node}: {len(node.cards)} card(s), {len(engines)} engine(s), host "
                  f"{node.host.memory_gib:g} GiB / {node.host.cpu_cores} cores", style="italic")]
    for p in loaded.plans:
        kv = p.contract.kv_cache
        working = working_memory(p)
        held = p.card_bytes + p.replicas * sum(n for _, n in working)
        each = "" if p.replicas == 1 else f", {p.replicas} replicas (figures per engine)"
        lines += [
            Text.assemble(
                (p.card_id, "bold"),
                f" ({p.card.model}): ",
                (p.contract.contract, "bold"),
                f", {p.contract.backend}{each}",
            ),
            Text(
                f"  token budget {p.token_budget:,}, slots {p.slots:,}, full-length slots "
                f"{p.full_length_slots:,}"
            ),
            Text(
                f"  KV pool {fmt_bytes(p.kv_pool_bytes)}: {p.num_blocks:,} x "
                f"{kv.tokens_per_block} blocks"
            ),
            Text(
                "  weights "
                + " + ".join(
                    [
                        fmt_bytes(p.weights_bytes),
                        f"KV pool {fmt_bytes(p.kv_pool_bytes)}",
                        *(f"{what} {fmt_bytes(n)}" for what, n in working),
                    ]
                )
            ),
            Text(f"  card memory {fmt_bytes(held)} of {fmt_bytes(p.card_memory_bytes)}"),
        ]
    if len(engines) > len(loaded.plans):
        lines.append(Text(f"engines (one process each): {', '.join(engines)}"))
    lines.append(Text("(--wide: one row per card)", style="dim"))
    return Group(*lines)


def engine_argument_lines(loaded, *, wide: bool = False, width: int = 80) -> list[str]:
    """Per card, the exact arguments forge will hand its engine (for each backend that declares
    them): what the contract became, before anything loads. --wide: one JSON object per card, keys
    sorted; else one `name: value` line per argument (nested configs as dotted names), wrapped to
    the screen's width."""
    import json
    import textwrap

    from forge.backends import get

    def flat(prefix: str, value) -> list[tuple[str, object]]:
        if isinstance(value, dict) and value:
            return [
                kv
                for k in sorted(value)
                for kv in flat(f"{prefix}.{k}" if prefix else str(k), value[k])
            ]
        return [(prefix, value)]

    out = []
    for p in loaded.plans:
        backend = get(p.contract.backend)
        if backend is None or backend.engine_arguments is None:
            continue
        args = backend.engine_arguments(p.contract, p)
        env = backend.environment() if backend.environment is not None else None
        head = f"card {p.card_id} ({p.contract.contract}, backend {p.contract.backend})"
        if wide:
            out.append(f"{head} engine arguments: " + json.dumps(args, sort_keys=True, default=str))
            if env is not None:
                out.append(
                    f"{head} environment (set; null: cleared): " + json.dumps(env, sort_keys=True)
                )
            continue
        out.append(f"{head} engine arguments:")
        rows = flat("", args) + [(f"env {k}", v) for k, v in sorted((env or {}).items())]
        for name, value in rows:
            text = f"{name}: {json.dumps(value, default=str)}"
            out += textwrap.wrap(text, width=width, initial_indent="  ", subsequent_indent="      ",
                                 break_long_words=True, break_on_hyphens=False)
    return out


def _check_before_loading(
    loaded, host: Optional[str], port: Optional[int], metrics_port: Optional[int]
) -> None:
    """What can be refused before an engine loads: the node's name is taken on this machine (held
    for this process's life from here on), or a port it must listen on is busy."""
    from forge.machine import registry
    from forge.machine.ports import check_free

    node = loaded.node
    registry.claim(node.node)
    check_free(
        host or node.control.host,
        node.control.port if port is None else port,
        "control endpoint",
        "--port",
    )
    check_free(
        node.metrics.host,
        node.metrics.port if metrics_port is None else metrics_port,
        "metrics endpoint",
        "--metrics-port",
    )


def register(cli: click.Group) -> None:
    @cli.command("provision")
    @click.argument("node_arg", metavar="NODE")
    @click.option("--dry-run", is_flag=True, help="validate and print the per-card plan; load no "
                                                  "engine")
    @click.option("--strict", is_flag=True, help="treat validation warnings as errors")
    @click.option("--host", default=None, help="control endpoint address; default: the node's "
                                               "control.host "
                  "(127.0.0.1). Off loopback a bearer token is required")
    @click.option("--port", type=click.IntRange(0, 65535), default=None,
                  help="control endpoint port; default: the node's control.port")
    @click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                  help="Prometheus /metrics port; default: the node's metrics.port")
    @click.option("--token-env", default=None, help="environment variable holding the bearer "
                                                    "token; default: "
                  "the node's control.token_env")
    @click.option("--cluster", default=None, metavar="ADDRESS",
                  help="join this Ray cluster: the node's cards and tiers become schedulable "
                       "resources and one "
                  "engine actor per card runs here (see docs/cluster.md)")
    @click.option(
        "--ray-node",
        type=click.Choice(["start", "existing"]),
        default="start",
        show_default=True,
        help="with --cluster: start this machine's Ray node (as the agent's child), or "
        "attach to one "
        "already started with the node's resources (printed by --dry-run --cluster)",
    )
    @click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
                  help="write the control URL (with --cluster: a JSON line) to this file once the "
                       "node serves")
    @click.option("--wide", is_flag=True, help="with --dry-run: one row per card, every column, "
                                               "whatever the "
                  "terminal's width (the default fits the terminal, 80 columns at least)")
    @card_transport_option
    def provision_cmd(
        node_arg: str,
        dry_run: bool,
        strict: bool,
        host: Optional[str],
        port: Optional[int],
        metrics_port: Optional[int],
        token_env: Optional[str],
        cluster: Optional[str],
        ray_node: str,
        ready_file: Optional[str],
        card_transport: Optional[str],
        wide: bool,
    ) -> int:
        """Validate NODE (a node description, NODE.yaml, or `local`: the embedded CPU node shipped
        with forge), probe the machine, load one engine per card (each in its own worker process)
        and serve the node."""
        from forge.cli.node_arg import description_path
        from forge.config.load import load_node

        loaded = load_node(description_path(node_arg, "provision"), strict=strict)
        for w in loaded.warnings:
            click.echo(w.render(), err=True)
        if dry_run:
            from forge.cli import screen

            console = screen.console(wide)
            console.print(
                screen.fitting(console, plan_table(loaded), lambda: compact_plan_table(loaded))
            )
            for line in engine_argument_lines(loaded, wide=wide, width=max(40, console.width)):
                click.echo(line)
            if cluster is not None:
                import json

                from forge.cluster.names import node_resources

                click.echo("Ray resources (ray start --resources): "
                           + json.dumps(node_resources(loaded), sort_keys=True))
                from forge.cluster.threads import card_threads

                click.echo(f"Ray CPUs (ray start --num-cpus): {loaded.node.host.cpu_cores}; engine "
                           "threads: "
                           + ", ".join(f"{p.card_id} {card_threads(p, loaded.node.host.cpu_cores)}"
                                       for p in loaded.plans))
            return 0
        if cluster is not None:
            if card_transport is not None:
                raise UsageError("--card-transport applies to a node on this machine; with "
                                 "--cluster each card's "
                                 "engine runs in its Ray actor")
            if host is not None or port is not None or token_env is not None:
                raise UsageError("--host/--port/--token-env configure the single-machine control "
                                 "endpoint; "
                                 "with --cluster, jobs reach the engines through Ray")
            from forge.cluster.agent import provision_on_cluster, refuse_replicas

            refuse_replicas(loaded)

            return provision_on_cluster(
                loaded, cluster, ray_node=ray_node, metrics_port=metrics_port, ready_file=ready_file
            )
        if ray_node != "start":
            raise UsageError("--ray-node applies to --cluster")
        from forge.node.provision import provision_and_serve

        _check_before_loading(loaded, host, port, metrics_port)
        from forge.cli.interrupt import exit_at_once_until_draining

        exit_at_once_until_draining(f"while node {loaded.node.node} starts")
        options = {"host": host, "port": port, "metrics_port": metrics_port, "token_env": token_env,
                   "ready_file": ready_file, "card_transport": card_transport or "process"}
        rv = provision_and_serve(loaded, **{k: v for k, v in options.items() if v is not None})
        return rv if isinstance(rv, int) else 0
