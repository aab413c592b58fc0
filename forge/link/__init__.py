"""The protocol between a node and an engine host (link.py) and what carries it (transport.py): a
worker process (process.py over forge/host/channel.py), a thread of the node's own process
(thread.py), a Ray actor (forge/cluster/actor.py)."""
