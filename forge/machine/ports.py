"""Is a port free to listen on? Asked before any engine loads, so a busy port costs no loading time
and answers in one line instead of the web server's raw `[Errno 98]` after the engines are up."""
from __future__ import annotations

import errno
import socket

from forge.errors import ForgeError


def _holder(port: int) -> str:
    """A node of this machine's registry that serves on `port`, if one does (the likely holder)."""
    from forge.machine import registry

    try:
        live = registry.nodes()
    # a registry forge does not believe names no holder: the port's own message stands
    except ForgeError:
        return ""
    for n in live:
        for key in ("control_url", "metrics_url"):
            url = n.get(key) or ""
            if url.rstrip("/").rsplit(":", 1)[-1].split("/")[0] == str(port):
                return f" (node {n['node']!r}, pid {n.get('pid')}, serves there)"
    return ""


def check_free(host: str, port: int, what: str, flag: str) -> None:
    """Refuse, in one line naming `flag`, a host:port that cannot be listened on. Port 0 (any free
    port) passes. The probe binds like the servers do (SO_REUSEADDR), so a port in TIME_WAIT is not
    called busy."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ForgeError(f"{what}: cannot listen on {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ForgeError(
                    f"{what}: port {port} on {host} is already in use{_holder(port)}; "
                    f"pass {flag} "
                    "with another port (0 picks a free one), or stop what holds it"
                ) from None
            raise ForgeError(f"{what}: cannot listen on {host}:{port}: {e.strerror}") from None
