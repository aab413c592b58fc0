"""A request whose answer is sent as it grows (Node.stream, forge serve's `stream=True`): an async
iterator of text pieces, then the request's Answer, the same Answer submit would give.

The engine reports the request's ids every step (RequestOptions.stream: only this request; bulk work
is unchanged), its host sends the text beyond what it sent
(forge/host/link_sessions.py::LinkSessions.partial) and the link hands each piece here. Stop strings
are applied as the text comes (forge/requests/stops.py::StopHold: text that could begin a stop
string waits for the next piece); the pieces join into exactly the answer's text, whose last part
comes with the end. A guided request is not streamed piece by piece: its output is checked whole
first, then sent as one piece (a text that fails its guide must never have reached the client). A
request sent again after its engine was lost starts its output again: the pieces already sent are
not repeated, and the final check below catches an output that came out different (a sampled
request)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator

from forge.errors import ForgeError
from forge.node.interface import Answer, Prompt
from forge.requests import GenerateParams
from forge.requests.stops import StopHold, StopRule

if TYPE_CHECKING:
    from forge.node.linked import LinkedNode


async def stream_request(node: "LinkedNode", prompt: Prompt, params: GenerateParams, *,
                         wait: bool = True) -> AsyncIterator[str | Answer]:
    if params.choice is not None or params.json_schema is not None or params.embed:
        answer = await node.submit(prompt, params, wait=wait)
        if answer.generation.text:
            yield answer.generation.text
        yield answer
        return
    # Unbounded by type, bounded by the request: one piece per generated token at most, plus the
    # end.
    pieces: asyncio.Queue = asyncio.Queue()
    req, fut, guide = await node._enqueue(prompt, params, wait, pieces)
    hold = (
        StopHold(StopRule(params.stop, params.include_stop_str_in_output)) if params.stop else None
    )
    sent, got = "", ""               # returned so far; the longest output received (of any attempt)
    attempt, text = req.attempt, ""  # the attempt the pieces are of, and its output so far
    try:
        while True:
            item = await pieces.get()
            if item is None:
                break
            at, piece = item
            if at != attempt:  # sent again: its output starts over; what was sent is not repeated
                attempt, text = at, ""
            text += piece
            if len(text) <= len(got):
                continue
            new, got = text[len(got):], text
            out = hold.take(new) if hold is not None else new
            if out:
                sent += out
                yield out
        eid, res = fut.result()
    except BaseException:
        if not fut.done():  # the caller left (a client gone, a deadline): the engine stops it
            node._abandon(req)
        raise
    finally:
        node._futures.pop(req.request_id, None)
        node._streams.pop(req.request_id, None)
    answer = node._answer(eid, res, params, guide)
    text = answer.generation.text
    if not text.startswith(sent):
        raise ForgeError(f"card {eid}: the streamed text ({len(sent)} characters) is not how the "
                         "answer begins; "
                         "the request was sent again after its engine was lost and came out "
                         "different")
    if len(text) > len(sent):
        yield text[len(sent):]
    yield answer
