"""A provisioned node seen from `forge deploy` and `forge serve --remote` (the Node interface over
HTTP). The prompt (or chat messages) and the GenerateParams travel whole: the node's own submit
applies the request rules (its tokenizer counts the tokens up to a stop string, its template renders
a chat).

Bulk calls (wait=True) are coalesced into batched POSTs: one HTTP round trip per request would cap a
job near a thousand requests/s; calls that arrive within `linger_s` (or until `max_batch`) travel
together, with a bounded number of POSTs in flight. Online calls (wait=False, forge serve) go one
POST each: cancelling one closes its connection and the node's control endpoint cancels that
request's engine work; a full node answers 429 (QueueFull).

Every call ends: each batch's futures are resolved whatever its POST does (an item that cannot be
sent, a reply that cannot be read, a short reply, a cancelled task), and a watchdog probes the
node's /health: a node that has answered nothing for `stall_window_s` (frozen, SIGSTOP, a dead host)
fails every open call with NodeDown, the same window in which an embedded run notices a stalled
engine. So does a node that answers /health but, with a batch posted, answers no POST and shows no
progress in its /v1/stats (engine steps, tokens, requests, dispatches) for that window: the POST's
own read timeout (minutes, for work queued on a busy node) never decides alone."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Optional

import httpx

from forge import constants
from forge.broker.types import QueueFull
from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.link.coalesce import Coalescer
from forge.node import answer_check
from forge.node.interface import Answer, Node, Prompt
from forge.requests import GenerateParams, Generation
from forge.requests.messages import Chat
from forge.watchdogs.awake import pause_clock

CONNECT_RETRIES = 3
PROBE_INTERVAL_S = 2.0
CLOSE_GRACE_S = 5.0
# The counters of a node's /v1/stats engines that move while it works (engine_steps, on every step
# of even one long generation): any change is progress.
PROGRESS_FIELDS = (
    "card",
    "engine_steps",
    "output_tokens",
    "input_tokens",
    "requests_ok",
    "requests_failed",
    "requests_cancelled",
    "in_flight",
)


def generate_item(prompt: Prompt, params: GenerateParams) -> dict[str, Any]:
    """One item of a node's /v1/generate body (forge/node/endpoint.py's GenerateItem), from a call's
    settings: the one encoder for every client of a provisioned node (forge deploy, forge serve
    --remote). A prompt that is neither text nor a list goes as it is: the node's check names it, as
    it would for a call in its own process."""
    item: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": params.seed,
        "embed": params.embed,
        "priority": params.priority,
        "deadline_s": params.deadline_s,
    }
    if params.choice is not None:
        item["choice"] = list(params.choice)
    if params.json_schema is not None:
        item["json_schema"] = params.json_schema
    if params.stop:  # applied by the node, whose tokenizer counts the tokens up to the match
        item["stop"] = list(params.stop)
        item["include_stop_str_in_output"] = params.include_stop_str_in_output
    if isinstance(prompt, Chat):
        item["messages"] = list(prompt.messages)
        if prompt.transcript_fallback:
            item["transcript_fallback"] = True
    else:
        item["prompt"] = list(prompt) if isinstance(prompt, (list, tuple)) else prompt
    return item


def answer_of(out: Any, node: str = "at the other end") -> Answer:
    """A node's answer to one request, every field checked (forge/node/answer_check.py), or that
    request's error."""
    return Answer(answer_check.generation_of(out, node), answer_check.hidden_of(out, node),
                  answer_check.stop_reason_of(out, node))


def generation_of(out: Any, node: str = "at the other end") -> Generation:
    return answer_check.generation_of(out, node)


class RemoteNode(Node):
    def __init__(
        self,
        url: str,
        *,
        token: Optional[str] = None,
        max_batch: int = 256,
        linger_s: float = 0.002,
        max_posts_in_flight: int = 8,
        timeout_s: float = 600.0,
        stall_window_s: float = constants.STALL_WINDOW_S,
        max_connections: int = 100,
    ):
        self.url = self.remote_url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # The read timeout bounds one batch's POST (work queued on a busy node may take minutes);
        # silence is the watchdog's business, within stall_window_s.
        self._client = httpx.AsyncClient(base_url=self.url, headers=headers,
                                         limits=httpx.Limits(max_connections=max_connections),
                                         timeout=httpx.Timeout(timeout_s, connect=10.0))
        self._stall_window_s = stall_window_s
        self._posts = asyncio.Semaphore(max_posts_in_flight)
        self._batches: Coalescer[bytes] = Coalescer(
            self._post, max_batch=max_batch, linger_s=linger_s
        )
        self._open: set[asyncio.Future] = set()  # every call not yet answered, queued or posted
        self._watchdog: Optional[asyncio.Task] = None
        self._silent: Optional[NodeDown] = None
        self._posting = 0                                # POSTs sent and not yet answered
        self._answered_at = time.monotonic()             # when a POST last got an answer
        self.name = "?"
        self.info: dict = {}
        self._online = 0                                 # online calls (one POST each) in flight

    async def start(self) -> dict:
        try:
            r = await self._client.get("/v1/node")
        except httpx.HTTPError as e:
            raise ForgeError(f"node at {self.url} is unreachable: {e}") from None
        if r.status_code == 401:
            raise ForgeError(
                f"node at {self.url} refused the token (set the node's token variable)"
            )
        if r.status_code != 200:
            raise ForgeError(f"node at {self.url} answered {r.status_code}: {r.text[:200]}")
        self.info = r.json()
        self.name = self.info.get("node", "?")
        self.started_at = time.time()
        self._watchdog = asyncio.ensure_future(self._watch())
        return self.info

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        self._batches.flush()
        # answers on their way get a moment; a frozen node does not hold the exit for 600 s
        if self._batches.tasks:
            _, late = await asyncio.wait(set(self._batches.tasks), timeout=CLOSE_GRACE_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self._client.aclose()

    async def stop(self) -> None:
        self.closed = True
        await self.close()

    def describe(self) -> dict:
        return self.info

    def open_requests(self) -> int:
        return len(self._open) + self._online

    async def submit(self, prompt: Prompt, params: GenerateParams, *, wait: bool = True) -> Answer:
        body = self._encode(generate_item(prompt, params))
        return answer_of(await (self._call(body) if wait else self._call_alone(body)), self.name)

    def _encode(self, item: dict) -> bytes:
        try:  # encoded here, alone: an item that cannot travel fails its own call, never its batch
            return json.dumps(
                item, ensure_ascii=False, allow_nan=False, separators=(",", ":")
            ).encode("utf-8")
        # a lone surrogate in the prompt, a message or a stop string
        except UnicodeEncodeError as e:
            raise RequestRejected(f"the request cannot be sent to node {self.name}: it holds a "
                                  "lone surrogate "
                                  f"(U+{ord(e.object[e.start]):04X}), which is not valid Unicode "
                                  "text") from None
        except (TypeError, ValueError, RecursionError) as e:
            raise RequestRejected(f"the request cannot be sent to node {self.name}: "
                                  f"{type(e).__name__}: {e}") from None

    async def _call_alone(self, body: bytes) -> dict:
        """One POST for one online call: cancelling it closes the connection (the node cancels the
        work), and a full node is QueueFull at once (forge serve answers 429)."""
        if self.closed:
            raise RequestRejected(f"node {self.name} is draining")
        self._online += 1
        try:
            r = await self._client.post("/v1/generate", content=b'{"requests":[' + body + b"]}",
                                        headers={"content-type": "application/json"})
        except httpx.TransportError as e:
            raise ForgeError(f"node {self.name} at {self.url}: {type(e).__name__}: {e}") from None
        except BaseException:
            self.abandoned += 1  # cancelled: the connection closes and the node cancels the work
            raise
        finally:
            self._online -= 1
        if r.status_code == 429:
            raise QueueFull(f"node {self.name} answered 429")
        if r.status_code == 503:
            raise NodeDown(f"node {self.name} is draining or down")
        if r.status_code != 200:
            raise ForgeError(f"node {self.name} answered {r.status_code}: {r.text[:200]}")
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._answer([(body, fut)], r)
        return self._outcome(fut.result())

    async def _call(self, body: bytes) -> dict:
        if self._silent is not None:
            raise self._silent
        fut = self._batches.add(body)
        self._open.add(fut)
        fut.add_done_callback(self._open.discard)
        return self._outcome(await fut)

    def _outcome(self, out: Any) -> dict:
        answer_check.raise_if_error(out, self.name)
        return out

    async def _post(self, batch: list[tuple[bytes, asyncio.Future]]) -> None:
        err: BaseException = ForgeError(f"node {self.name}: the request failed")
        try:
            async with self._posts:
                body = b'{"requests":[' + b",".join(b for b, _ in batch) + b"]}"
                for attempt in range(CONNECT_RETRIES):
                    r = None
                    if self._silent is not None:
                        err = self._silent
                        break
                    self._posting += 1
                    try:
                        r = await self._client.post("/v1/generate", content=body,
                                                    headers={"content-type": "application/json"})
                        self._answered_at = time.monotonic()
                    except httpx.TransportError as e:
                        err = NodeDown(f"node {self.name} at {self.url} is unreachable: "
                                       f"{type(e).__name__}: {e}")
                    finally:
                        self._posting -= 1
                    if r is not None:
                        if r.status_code == 200:
                            self._answer(batch, r)
                            return
                        cls = NodeDown if r.status_code == 503 else ForgeError
                        err = cls(f"node {self.name} answered {r.status_code}: {r.text[:200]}")
                        if r.status_code not in (429, 503):
                            break
                    await asyncio.sleep(0.2 * 2**attempt)
        except asyncio.CancelledError:
            err = self._silent or ForgeError(f"node {self.name}: the job stopped before the "
                                             "request was answered")
            raise
        except ForgeError as e:
            err = e
        except Exception as e:  # noqa: BLE001 - whatever went wrong, this batch's calls must end
            err = ForgeError(f"node {self.name}: the request failed: {type(e).__name__}: {e}")
        finally:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(err)

    def _answer(self, batch: list[tuple[bytes, asyncio.Future]], r: httpx.Response) -> None:
        try:
            results = r.json()["results"]
            # each result is checked by its own call (answer_check)
            if not isinstance(results, list):
                raise TypeError("results is not a list")
        except (ValueError, KeyError, TypeError) as e:
            raise ForgeError(f"node {self.name} sent a reply forge cannot read "
                             f"({type(e).__name__}: {e})") from None
        for (_, fut), res in zip(batch, results):
            if not fut.done():
                fut.set_result(res)
        if len(results) != len(batch):      # the rest are failed by _post's finally
            raise ForgeError(f"node {self.name} answered {len(results)} of {len(batch)} requests")

    async def _watch(self) -> None:
        """Probe /health while calls are open; silence for the stall window fails them all
        (NodeDown). With POSTs waiting, /v1/stats too: a node that answers no POST and shows no
        progress for the window fails them as well. Silence is counted in this process's running
        time: a job stopped (Ctrl-Z) and woken does not blame the node for its own absence
        (forge/watchdogs/awake.py)."""
        clock = pause_clock()
        last_heard = last_progress = time.monotonic()
        mark: Optional[str] = None
        probe_timeout = max(1.0, min(10.0, self._stall_window_s / 3))
        while True:
            await asyncio.sleep(min(PROBE_INTERVAL_S, self._stall_window_s / 4))
            if not self._open:
                # nothing waits on the node: nothing to notice
                last_heard = last_progress = time.monotonic()
                continue
            wait_s = min(
                probe_timeout, max(self._stall_window_s - clock.awake_since(last_heard), 0.1)
            )
            try:  # bounded here (whatever the transport does), and never past the end of the window
                await asyncio.wait_for(self._client.get("/health", timeout=probe_timeout), wait_s)
                last_heard = time.monotonic()  # any answer, even an error status, is a node alive
            except (httpx.HTTPError, asyncio.TimeoutError):
                pass
            silent_s = clock.awake_since(last_heard)
            if silent_s >= self._stall_window_s:
                return self._give_up(NodeDown(f"node {self.name} at {self.url} has answered "
                                              "nothing for "
                                              f"{silent_s:.0f} s (frozen, stopped or unreachable)"))
            if not self._posting:
                last_progress = time.monotonic()
                continue
            now_mark = await self._progress_mark(wait_s)
            if now_mark is not None and now_mark != mark:
                mark, last_progress = now_mark, time.monotonic()
            idle_s = clock.awake_since(max(last_progress, self._answered_at))
            if idle_s >= self._stall_window_s:
                return self._give_up(NodeDown(
                    f"node {self.name} at {self.url} answers /health but has answered no request "
                    "and shown no "
                    f"progress for {idle_s:.0f} s (FORGE_STALL_WINDOW_S is "
                    f"{self._stall_window_s:g} s)"))

    async def _progress_mark(self, timeout_s: float) -> Optional[str]:
        """What of the node's /v1/stats moves while it works (None when it cannot be read)."""
        try:
            r = await asyncio.wait_for(self._client.get("/v1/stats", timeout=timeout_s), timeout_s)
            body = r.json()
            moving = [[e.get(k) for k in PROGRESS_FIELDS] for e in body["engines"]]
            return json.dumps(
                [moving, body["broker"].get("dispatched"), body.get("open_requests")], default=str
            )
        except (
            httpx.HTTPError,
            asyncio.TimeoutError,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
        ):
            return None

    def _give_up(self, why: NodeDown) -> None:
        self._silent = why
        for task in list(self._batches.tasks):
            task.cancel()
        for fut in list(self._open):
            if not fut.done():
                fut.set_exception(why)
