"""`forge provision NODE.yaml`: check the hardware, load the engines, serve the node until stopped.

SIGINT/SIGTERM drain: the node stops accepting (503), in-flight requests finish (bounded by
DRAIN_TIMEOUT_S), engines shut down, the registry entry is removed, and the process exits 0."""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Optional

from forge.config.load import LoadedDescription
from forge.errors import ForgeError
from forge.node.endpoint import build_app, require_token
from forge.node.local import CardTransport, LocalNode
from forge.node.serve_loop import serve_until_stopped
from forge.machine import node_proof, registry, warm_node
from forge.web.server import NotServing, QuietServer

log = logging.getLogger("forge.provision")
DRAIN_TIMEOUT_S = 60.0
STATS_INTERVAL_S = 0.5


def check_hardware(loaded: LoadedDescription) -> None:
    """Refuse a node whose real cards differ from its description."""
    from forge.hardware.probe import check_node_against_hardware, probe_all

    problems = check_node_against_hardware(loaded.node, probe_all())
    if problems:
        raise ForgeError("\n".join(problems))


def provision_and_serve(
    loaded: LoadedDescription,
    *,
    host: Optional[str] = None,
    port: Optional[int] = None,
    metrics_port: Optional[int] = None,
    token_env: Optional[str] = None,
    ready_file: Optional[str] = None,
    card_transport: CardTransport = "process",
) -> int:
    node = loaded.node
    host = host or node.control.host
    port = node.control.port if port is None else port
    metrics_port = node.metrics.port if metrics_port is None else metrics_port
    token_env = token_env or node.control.token_env
    token = os.environ.get(token_env) or None
    require_token(host, token, token_env)
    check_hardware(loaded)
    # before any engine library loads: they set variables of the environment the digest reads
    # (transformers does)
    digest = warm_node.description_digest(loaded)
    return asyncio.run(
        _serve(loaded, host, port, metrics_port, token, ready_file, card_transport, digest)
    )


async def _serve(
    loaded: LoadedDescription,
    host: str,
    port: int,
    metrics_port: int,
    token: Optional[str],
    ready_file: Optional[str],
    card_transport: CardTransport,
    digest: str,
) -> int:
    from forge.metrics import ForgeMetrics

    t0 = time.monotonic()
    runtime = LocalNode(loaded, card_transport=card_transport)
    await runtime.start()
    metrics = ForgeMetrics()
    _, mport = metrics.serve(loaded.node.metrics.host, metrics_port)
    # the node's key: written beside its entry (this user alone reads it), proven on /health before
    # any client picking the node from the registry sends it a token or a record
    # (forge/machine/node_proof.py)
    prover = node_proof.Prover(runtime.name, node_proof.new_key())
    web = QuietServer(build_app(runtime, token=token, prover=prover), host, port)
    try:
        serve_task = await web.start()
    except NotServing as e:
        await runtime.stop()
        raise ForgeError(f"control endpoint could not bind {host}:{port}: {e}") from None
    control_url = f"http://{host}:{web.port}"
    prover.control_url = control_url
    metrics_url = f"http://{loaded.node.metrics.host}:{mport}/metrics"
    registry.register(
        runtime.name,
        {
            "control_url": control_url,
            "metrics_url": metrics_url,
            "source": str(loaded.node.source),
            "started_at": time.time(),
            warm_node.DIGEST_KEY: digest,
            warm_node.TRANSPORT_KEY: card_transport,
            "cards": [c["card"] + ":" + c["tier"] for c in runtime.describe()["cards"]],
        },
        key=prover.key,
    )
    print(f"forge: node {runtime.name} up in {time.monotonic() - t0:.1f} s — control "
          f"{control_url}, "
          f"metrics {metrics_url}, {len(runtime.links)} card(s)", flush=True)
    if ready_file:
        with open(ready_file, "w") as f:
            f.write(control_url + "\n")

    def observe() -> None:
        for s in runtime.engine_stats():
            metrics.observe_engine(s)
        metrics.observe_broker(runtime.broker_stats())

    def forget() -> None:
        registry.unregister(runtime.name)
        metrics.close()

    return await serve_until_stopped(
        runtime,
        web,
        serve_task,
        label=f"node {runtime.name}",
        drain_s=DRAIN_TIMEOUT_S,
        every_s=STATS_INTERVAL_S,
        tick=observe,
        after_stop=forget,
    )
