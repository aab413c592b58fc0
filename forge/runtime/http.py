"""uvicorn as forge runs it: without uvicorn's own signal handling, because forge drains its node first; with
bounded connections (forge/runtime/connections.py), a bounded request head, and one error shape
(forge/runtime/http_errors.py)."""
from __future__ import annotations

import contextlib

MAX_REQUEST_HEAD_BYTES = 64 * 1024     # request line + headers (h11 refuses more with 400)


class QuietServer:
    """A uvicorn server for `app` on host:port; `await .server.serve()`, stop with `.server.should_exit`.
    `.connections` holds its open connections by client address."""

    def __init__(self, app, host: str, port: int, *, limits=None, **config):
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from forge.runtime.connections import ConnectionBook, ConnectionLimits, limited_protocol
        from forge.runtime.http_errors import ErrorShape

        class Quiet(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        self.connections = ConnectionBook(limits or ConnectionLimits(), backlog=config.pop("backlog", 2048))
        config.update(backlog=self.connections.backlog)
        config.setdefault("h11_max_incomplete_event_size", MAX_REQUEST_HEAD_BYTES)
        self.server = Quiet(uvicorn.Config(ErrorShape(app), host=host, port=port, log_level="warning",
                                           lifespan="off", access_log=False,
                                           http=limited_protocol(AutoHTTPProtocol, self.connections), **config))

    @property
    def port(self) -> int:
        """The port really bound (port 0 picks a free one)."""
        for s in self.server.servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return 0
