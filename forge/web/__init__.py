"""forge's HTTP servers (`forge serve` and a node's control endpoint) as uvicorn runs them:
server.py starts and stops one (forge drains its node before uvicorn may exit), connections.py
bounds its connections, request heads and bodies, errors.py gives every answer one error shape."""
