"""A node proves it is the node its registry entry names before anything of a user's is sent to it.

Why. An entry's `control_url` is only a file's word: a process on another port (a planted entry, a
rewritten URL, a logging proxy, whatever took a dead node's port) would have received the run's
bearer token in its first request, then the run's records. Now each node has a key, 32 random bytes
that `forge provision` writes beside its entry readable by this user alone (NAME.key,
forge/machine/registry_files.py). Before any token or record goes to a node picked from the
registry, the client sends a fresh random challenge, and nothing else, in `GET
/health?challenge=...` (no Authorization header); the node answers HMAC-SHA256(key, node name, its
own control URL, challenge). Only a holder of the key can answer, and the answer binds the URL the
node registered: a proxy that relays the challenge to the real node gets a proof for the node's URL,
not for its own, so an entry whose URL was rewritten fails too. The key itself never travels. What
is left: the proof holds for the moment it is made; a process that took the port between the proof
and the next request (the node killed in that instant) would meet a run that already trusts the
URL."""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from typing import Optional
from urllib.parse import urlsplit

PROOF_TIMEOUT_S = 2.0
CHALLENGE = re.compile(r"[0-9a-f]{32,128}")


def new_key() -> str:
    return secrets.token_hex(32)


def proof(key: str, node: str, control_url: str, challenge: str) -> str:
    message = f"forge node proof\n{node}\n{control_url.rstrip('/')}\n{challenge}".encode()
    return hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()


class Prover:
    """The node's side: it answers a challenge once it knows the URL it serves at (after its server
    has bound)."""

    def __init__(self, node: str, key: str):
        self.node, self.key = node, key
        self.control_url: Optional[str] = None

    def answer(self, challenge: Optional[str]) -> Optional[str]:
        if self.control_url is None or challenge is None or not CHALLENGE.fullmatch(challenge):
            return None
        return proof(self.key, self.node, self.control_url, challenge)


def is_loopback_url(url: str) -> bool:
    """An http URL whose host is a loopback address (127.0.0.0/8, ::1) or `localhost`: a server of
    this machine."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port        # a port that is no number raises ValueError
    except ValueError:
        return False
    if parts.scheme != "http" or parts.username is not None or parts.password is not None:
        return False
    return is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unproven(entry: dict, key: Optional[str], timeout_s: float = PROOF_TIMEOUT_S) -> Optional[str]:
    """None when the server at the entry's control URL proved it holds `key` for that node and URL;
    else why not, in a few words. Only the challenge is sent: no token, no record, no cookie, no
    redirect followed."""
    import httpx

    url = entry["control_url"].rstrip("/")
    if key is None:
        return "cannot prove it is that node (no key of it)"
    challenge = secrets.token_hex(16)
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
            r = client.get(url + "/health", params={"challenge": challenge})
        got = r.json().get("proof") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return f"does not answer at {url}"
    if not isinstance(got, str) or not hmac.compare_digest(
        got, proof(key, entry["node"], url, challenge)
    ):
        return f"the server at {url} did not prove it is that node (nothing was sent to it)"
    return None
