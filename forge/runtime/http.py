"""uvicorn as forge runs it: without uvicorn's own signal handling, because forge drains its node first."""
from __future__ import annotations

import contextlib


class QuietServer:
    """A uvicorn server for `app` on host:port; `await .server.serve()`, stop with `.server.should_exit`."""

    def __init__(self, app, host: str, port: int, **config):
        import uvicorn

        class Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        self.server = Quiet(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                           access_log=False, **config))

    @property
    def port(self) -> int:
        """The port really bound (port 0 picks a free one)."""
        for s in self.server.servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return 0
