"""`forge deploy FILE.py --cluster ADDRESS`: a job across every node provisioned on a Ray cluster.

The same job as on one machine (forge/functions/job.py: ledger, output, resume, metrics, report); only
the node differs: a ClusterNode, whose broker spans every engine on the cluster."""
from __future__ import annotations

import asyncio

from forge.functions.job import JobOptions


def run_cluster(address: str, opts: JobOptions, *, grouping: bool = True) -> int:
    from forge.cluster.client import ClusterNode
    from forge.cluster.connect import connect, disconnect
    from forge.functions.job import _run
    from forge.functions.loader import load_function

    spec, digest = load_function(opts.target)
    owned = connect(address)
    try:
        async def main() -> int:
            node = ClusterNode(address, grouping=grouping)
            await node.start()
            try:
                return await _run(spec, digest, node, opts, node_label=node.name,
                                  engine_stats=node.engine_stats, broker_stats=node.broker_stats)
            finally:
                await node.stop()

        return asyncio.run(main())
    finally:
        disconnect(owned)
