"""`forge deploy FILE.py --cluster ADDRESS`: a job across every node provisioned on a Ray cluster.

The same job as on one machine (forge/functions/job.py: ledger, output, resume, metrics, report);
only the node differs: a ClusterNode, whose broker spans every engine on the cluster."""
from __future__ import annotations

from forge.functions.job import JobOptions


def run_cluster(address: str, opts: JobOptions, *, grouping: bool = True) -> int:
    from forge.cluster.client import ClusterNode
    from forge.cluster.connect import connect, disconnect
    from forge.functions.job import run_with_node

    owned = connect(address)
    try:
        return run_with_node(lambda: ClusterNode(address, grouping=grouping), opts)
    finally:
        disconnect(owned)
