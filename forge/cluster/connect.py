"""Reaching a Ray cluster: Ray present and pinned, usage stats off, the auth mode stated, one
connection.

Token auth is Ray's (RAY_AUTH_MODE=token; the token in RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH
names, or ~/.ray/auth_token, the same on every machine). forge never lets Ray pick the mode:
RAY_AUTH_MODE must be set, and `disabled` is refused for a cluster address that is not loopback."""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
from pathlib import Path
from typing import Any

from forge.cluster.names import NAMESPACE
from forge.errors import ForgeError, UsageError

RAY_VERSION = "2.60.0"
CONNECT_CHECK_TIMEOUT_S = 5.0
INSTALL_HINT = "pip install 'forge-llm[ray]'"
RAY_WORKER_PORTS = (10002, 19999)  # `ray start`'s default --min-worker-port and --max-worker-port


def require_ray() -> Any:
    """The ray module, at the pinned version, or one clear line saying what to install."""
    try:
        import ray
    except ImportError:
        raise ForgeError(f"--cluster needs Ray {RAY_VERSION}: {INSTALL_HINT}") from None
    if ray.__version__ != RAY_VERSION:
        raise ForgeError(f"--cluster needs Ray {RAY_VERSION} (found {ray.__version__}): "
                         f"{INSTALL_HINT}")
    return ray


def address_host(address: str) -> str:
    """The host part of a cluster address ('10.0.0.5:6379', 'ray://h:10001', '[::1]:6379',
    'auto')."""
    a = address.split("://", 1)[-1]
    if a.startswith("["):
        return a[1:a.index("]")] if "]" in a else a
    return a.rsplit(":", 1)[0] if a.count(":") == 1 else a


def is_loopback(host: str) -> bool:
    if host in ("localhost", "auto"):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    candidate = Path(path) if path else Path.home() / ".ray" / "auth_token"
    try:
        return candidate.is_file() and bool(candidate.read_text().strip())
    except OSError:
        return False


def check_environment(address: str) -> str:
    """Set usage stats off (unless stated) and check the auth mode; returns the mode."""
    if not address or not address.strip():
        raise UsageError("--cluster: give the Ray cluster's address, e.g. --cluster 10.0.0.5:6379")
    check_address(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is None:
        raise UsageError("--cluster: set RAY_AUTH_MODE explicitly: 'token' (with the cluster's "
                         "token in "
                         "RAY_AUTH_TOKEN or ~/.ray/auth_token, the same on every node) or "
                         "'disabled' "
                         "(loopback clusters only); see docs/cluster.md")
    mode = mode.strip().lower()
    if mode not in ("token", "disabled"):
        raise UsageError(f"--cluster: RAY_AUTH_MODE must be 'token' or 'disabled', got {mode!r}")
    host = address_host(address)
    if mode == "disabled" and not is_loopback(host):
        raise UsageError(
            f"--cluster {address}: refusing a cluster beyond loopback without token "
            "auth "
            "(RAY_AUTH_MODE=disabled); use RAY_AUTH_MODE=token and the cluster's token"
        )
    if mode == "token" and not _token_available():
        raise UsageError("--cluster: RAY_AUTH_MODE=token but no token found: set RAY_AUTH_TOKEN, "
                         "or "
                         "RAY_AUTH_TOKEN_PATH, or write ~/.ray/auth_token (the head's token, `ray "
                         "get-auth-token`)")
    return mode


def check_address(address: str) -> None:
    """A HOST:PORT whose form cannot name a Ray head, refused before anything starts (auto and
    ray:// pass)."""
    if address == "auto" or "://" in address:
        return
    host, colon, port = address.rpartition(":")
    if not colon or not host.strip("[]"):
        raise UsageError(f"--cluster {address}: give the head's HOST:PORT (its GCS port, e.g. "
                         "--cluster "
                         f"{address or '127.0.0.1'}:6379)")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--cluster {address}: the port must be a number from 1 to 65535, got "
                         f"{port!r}")


def in_worker_ports(address: str) -> bool:
    """The port lies in the range Ray gives its workers by default, where `ray start --head --port`
    fails."""
    port = address.rpartition(":")[2]
    return port.isdigit() and RAY_WORKER_PORTS[0] <= int(port) <= RAY_WORKER_PORTS[1]


def unreachable_line(address: str, why: str) -> str:
    """The one line that says a head cannot be reached, with the likely reason where forge can tell
    it."""
    line = (f"--cluster {address}: cannot reach the Ray cluster's head ({why}); is `ray start "
            "--head` running there, "
            "and is the port open to this machine?")
    if in_worker_ports(address):
        line += (f" Port {address.rpartition(':')[2]} lies in Ray's worker port range "
                 f"{RAY_WORKER_PORTS[0]}-"
                 f"{RAY_WORKER_PORTS[1]}, where `ray start --head --port` fails: start the head on "
                 "6379 or "
                 "another port outside it")
    return line


def unreachable(address: str, timeout_s: float = CONNECT_CHECK_TIMEOUT_S) -> str | None:
    """Why the cluster's GCS port cannot be reached over TCP (None if it can, or if the address is
    not host:port). Ray itself would retry for a minute or more before saying so."""
    if address == "auto" or "://" in address:
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def connect(address: str) -> bool:
    """Connect this process to the cluster as a Ray driver. Returns True when this call made the
    connection (the caller disconnects), False when the process was already connected."""
    ray = require_ray()
    check_environment(address)
    if ray.is_initialized():
        return False
    why = unreachable(address)
    if why:
        raise ForgeError(unreachable_line(address, why))
    try:
        ray.init(
            address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING
        )
    except ConnectionError as e:
        hint = (" (with RAY_AUTH_MODE=token, a missing or wrong token fails like this: it must be "
                "the head's)"
                if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else "")
        raise ForgeError(f"--cluster {address}: cannot reach the Ray cluster: {e}{hint}") from None
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds; the user gets one line
        raise ForgeError(f"--cluster {address}: cannot join the Ray cluster: {type(e).__name__}: "
                         f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from None
    return True


def disconnect(owned: bool) -> None:
    if owned:
        import ray

        ray.shutdown()
