"""One bounded read of a node's control endpoint per frame: GET /health and GET /v1/stats."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import httpx

from forge.errors import ForgeError

POLL_TIMEOUT_S = 3.0        # per request: a node that takes longer is reported, not waited on


class NodeUnreachable(ForgeError):
    """The node did not answer (refused, timed out, gone); `reason` is the why, without the who."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class Sample:
    at: float          # time.monotonic() when the replies arrived
    health: dict       # /health: node, status ("ok" | "degraded"), healthy_cards
    stats: dict        # /v1/stats: engines (EngineStats dicts), broker (BrokerStats dict + ratios)


class Poller:
    """Reads one node; `sample()` raises NodeUnreachable or a one-line ForgeError, never hangs."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "",
        token: Optional[str] = None,
        token_env: str = "FORGE_TOKEN",
        timeout_s: float = POLL_TIMEOUT_S,
        transport: Optional[httpx.BaseTransport] = None,
    ):
        self.url = url.rstrip("/")
        self.label = (
            f"node {name} at {self.url}" if name and name != self.url else f"node at {self.url}"
        )
        self.token_env = token_env
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )

    def _get(self, path: str) -> dict:
        try:
            r = self._client.get(path)
        except httpx.TimeoutException:
            reason = f"no answer to {path} within {self._client.timeout.read:g} s"
            raise NodeUnreachable(f"{self.label}: {reason}", reason) from None
        except httpx.HTTPError as e:
            reason = str(e) or type(e).__name__
            raise NodeUnreachable(f"{self.label} is unreachable: {reason} (is `forge provision` "
                                  "running?)",
                                  reason) from None
        if r.status_code == 401:
            raise ForgeError(f"{self.label} refused the token: set ${self.token_env} "
                             "to the node's bearer token (or pick the variable with --token-env)")
        if r.status_code != 200:
            raise ForgeError(f"{self.label}: GET {path} answered HTTP {r.status_code}")
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ForgeError(f"{self.url}{path}: the answer is not a JSON object (is this a forge "
                             "node?)")
        return body

    def sample(self) -> Sample:
        health = self._get("/health")
        stats = self._get("/v1/stats")
        if not isinstance(stats.get("engines"), list) or not isinstance(stats.get("broker"), dict):
            raise ForgeError(f"{self.url}/v1/stats: expected 'engines' (list) and 'broker' "
                             "(object) "
                             "— is this a forge node of the same version?")
        return Sample(at=time.monotonic(), health=health, stats=stats)

    def close(self) -> None:
        self._client.close()
