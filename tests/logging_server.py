"""A real HTTP server on 127.0.0.1 that logs every request it receives: what a server forge did not
start sees."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoggingServer:
    """An HTTP server on 127.0.0.1 that answers 200 {"status": "ok"} to everything and logs each
    request."""

    def __init__(self):
        self.seen: list[dict] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                n = int(self.headers.get("content-length") or 0)
                seen.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(n) if n else b"",
                    }
                )
                body = b'{"status": "ok", "node": "local", "cards": []}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def tokens_or_records(self) -> list[dict]:
        """What must never reach it: a bearer token, a body, anything but GET /health."""
        return [
            r
            for r in self.seen
            if any(k.lower() == "authorization" for k in r["headers"])
            or r["body"]
            or r["method"] != "GET"
            or not r["path"].startswith("/health")
        ]
