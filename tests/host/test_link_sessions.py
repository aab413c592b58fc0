"""LinkSessions: an engine host's link sessions around its queue, and the AdmissionSource its
admission runtime takes from. Requests arrive as a link sends them (wire tuples on a session,
from_wire); answers and given-back requests wait in their session until the link collects them."""
from __future__ import annotations

import asyncio
import time

from forge import constants
from forge.broker import EngineGeometry
from forge.engines.interface import RequestKey
from forge.host.link_sessions import LinkSessions
from forge.host.protocol import Collected
from forge.host.source import AdmissionSource

from forge.host.wire import from_wire

G = EngineGeometry(
    engine_id="cpu0",
    tokenizer_key="t",
    max_batch_size=4,
    max_num_tokens=512,
    max_input_len=64,
    max_output_len=32,
    tokens_per_block=16,
    kv_blocks_total=64,
)


def wire(i: int, *, attempt: int = 0, n: int = 8, max_new: int = 4, priority: int = 0) -> tuple:
    return (f"r{i}", attempt, list(range(n)), max_new, priority, None, 0.0)


def send(sessions: LinkSessions, sid: str, items: list[tuple]) -> int:
    """What EngineHost.submit does with a link's batch."""
    now = time.monotonic()
    return sessions.put(sid, [from_wire(it, sid, "t", now) for it in items])


async def collect(sessions: LinkSessions, sid: str) -> Collected:
    return await sessions.collect(sid, 0.0, 100)


async def take(sessions: LinkSessions, slots: int = 4):
    return await sessions.take(free_slots=slots, free_kv_blocks=64, timeout_s=0.0)


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))


def test_link_sessions_are_the_admission_runtimes_source():
    assert isinstance(LinkSessions(G, node="n", max_pending=4), AdmissionSource)


def test_a_batch_is_queued_and_what_cannot_be_goes_straight_back_to_its_link():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=2)
        assert send(sessions, "a", [wire(0), wire(1, n=100), wire(2), wire(3)]) == 2
        out = await collect(sessions, "a")
        assert out.returned == [("r3", 0)]  # max_pending: the link's broker holds it
        [(rid, attempt, finish, ids, text, hidden, error, n_in)] = out.results
        assert (rid, attempt, finish) == (
            "r1",
            0,
            "error",
        ) and "prompt 100 tokens > max_input_len 64" in error
        sessions.accepting = False  # draining: nothing more is queued
        assert send(sessions, "a", [wire(4)]) == 0 and (await collect(sessions, "a")).returned == [
            ("r4", 0)
        ]

    run(go())


def test_taken_requests_of_an_ended_session_are_dropped_and_their_keys_freed():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=8)
        send(sessions, "a", [wire(0)])
        send(sessions, "b", [wire(0), wire(1)])
        sessions.end("b")
        batch = await take(sessions)
        assert [r.key for r in batch] == [RequestKey("a", "r0", 0)]
        assert sessions.queue.in_flight() == 1                       # b's two are done with
        assert sessions.session("b") is None and send(sessions, "b", [wire(2)]) == 0

    run(go())


def test_given_back_requests_return_to_their_own_session_as_the_attempt_they_were():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=8)
        send(sessions, "a", [wire(0, attempt=2)])
        send(sessions, "b", [wire(1)])
        sessions.requeue(await take(sessions))
        assert (await collect(sessions, "a")).returned == [("r0", 2)]
        assert (await collect(sessions, "b")).returned == [("r1", 0)]
        assert sessions.queue.in_flight() == 0
        # its next attempt comes back as a new key
        assert send(sessions, "a", [wire(0, attempt=3)]) == 1

    run(go())


def test_abandon_marks_a_queued_request_only():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=8)
        send(sessions, "a", [wire(0), wire(1)])
        [first] = await take(sessions, slots=1)
        assert not sessions.abandon(first.key)  # taken: admission's cancel stops it instead
        assert sessions.abandon(RequestKey("a", "r1", 0)) and not sessions.abandon(
            RequestKey("a", "r1", 1)
        )
        [second] = await take(sessions)
        assert second.abandoned and not first.abandoned

    run(go())


def test_an_unhealthy_engine_gives_its_queue_back_and_wakes_every_link():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=8)
        send(sessions, "a", [wire(0), wire(1, priority=1)])
        send(sessions, "b", [wire(2)])
        waiting = asyncio.ensure_future(sessions.collect("b", 5.0, 100))
        await asyncio.sleep(0)
        sessions.set_engine_healthy(False)
        assert (await asyncio.wait_for(waiting, 1.0)).returned == [("r2", 0)]
        assert (await collect(sessions, "a")).returned == [("r1", 0), ("r0", 0)]   # in take order
        assert send(sessions, "a", [wire(3)]) == 0 and await take(sessions) == []
        sessions.set_engine_healthy(True)
        assert send(sessions, "a", [wire(3)]) == 1 and len(await take(sessions)) == 1

    run(go())


def test_deliveries_reach_every_session_with_their_mean_occupancy():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=8)
        sessions.session("a")
        sessions.session("b")
        sessions.record_delivery(100, 1.0, 0.5)
        sessions.record_delivery(300, 1.0, 1.0)
        assert (await collect(sessions, "a")).delivered == (400, 2.0, 0.75)
        assert (await collect(sessions, "a")).delivered == (0, 0.0, 1.0)
        assert (await collect(sessions, "b")).delivered == (400, 2.0, 0.75)

    run(go())


def test_a_streamed_requests_text_goes_out_in_pieces_an_incomplete_character_waits():
    # id 3 is the first byte of a character id 4 completes
    words = {1: "Hé", 2: "llo", 3: "\ufffd", 4: "!"}

    def decode(ids):
        text = "".join(words[i] for i in ids)
        return text.replace("\ufffd!", "é!")

    async def main():
        sessions = LinkSessions(G, node="n", max_pending=16)
        send(sessions, "s", [wire(1)])
        (req,) = await take(sessions)
        for upto in (1, 2, 3, 4):
            sessions.partial(req, list(range(1, upto + 1)), decode)
        got = await collect(sessions, "s")
        assert (
            got.partials == [("r1", 0, "Hé"), ("r1", 0, "llo"), ("r1", 0, "é!")] and not got.results
        )
        assert (await collect(sessions, "s")).partials == []          # each piece goes out once
        sessions.deliver(req, lambda: None)
        assert not sessions.sessions["s"].streamed  # the answer ends what it kept for the request

    run(main())


def test_a_request_turned_away_at_the_attempt_limit_is_given_up_not_returned():
    async def go():
        sessions = LinkSessions(G, node="n", max_pending=8)
        sessions.accepting = False  # draining: everything sent is turned away
        last = constants.REQUEST_ATTEMPT_LIMIT
        assert send(sessions, "a", [wire(0, attempt=last - 1), wire(1, attempt=last)]) == 0
        out = await collect(sessions, "a")
        assert out.returned == [("r0", last - 1)]                # may go again, as its next attempt
        assert out.given_up == [("r1", last, f"given back by the engine; gave up after {last + 1} "
                                             "attempts")]
        assert (await collect(sessions, "a")).given_up == []     # said once

    run(go())
