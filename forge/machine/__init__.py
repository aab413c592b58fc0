"""The nodes provisioned on this machine: their registry under $FORGE_HOME/nodes (registry.py),
which of its files forge believes (registry_files.py), a node's proof that it is the node its entry
names (node_proof.py), the node already up that a `forge run` may use (warm_node.py), and whether a
port is free before any engine loads (ports.py)."""
