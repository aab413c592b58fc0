"""A node: every card of one node description behind one interface (interface.py: `Node`,
`Node.submit` owning the whole request, its one typed `Answer`).

    linked.py        what a local node and a cluster job share: one broker, one link per engine, callers' futures
    local.py         `LocalNode`, the node on this machine (a worker process per card)
    remote.py        `RemoteNode`, a provisioned node over HTTP; answer_check.py checks each of its answers once
    streamed.py      `Node.stream`, a request's text as the engine makes it
    down.py          giving up on engines that are out
    endpoint.py      the node's HTTP control endpoint
    provision.py     `forge provision`; serve_loop.py serves a started node until a signal, then drains it

Importing this package imports nothing: each module is imported where it is used."""
