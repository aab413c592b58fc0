"""The `llm` handle's own checks: what it refuses before a request reaches the node, and that the
settings a job repeats for every record are made and checked once (forge/functions/llm.py); and the
node edge's one prompt check (forge/requests/prompt_bounds.py's checked_prompt, called by
Node.submit). Pure logic: the node is a recorder."""
from __future__ import annotations

import asyncio
import enum

import pytest

from forge.errors import RequestRejected
from forge.functions.api import GenerateParams, Generation
from forge.functions.llm import _MADE_PARAMS_MAX, NodeLLM
from forge.node.interface import Answer, Node
from forge.requests.prompt_bounds import checked_prompt


class Recorder(Node):
    def __init__(self):
        self.got: list[tuple] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def submit(self, prompt, params: GenerateParams, *, wait: bool = True) -> Answer:
        self.got.append((prompt, params))
        return Answer(Generation(text="", output_tokens=0, input_tokens=0, finish_reason="length"))


def ask(llm, prompt=(1, 2), **kw):
    return asyncio.run(llm.generate(list(prompt), **{"max_tokens": 4, **kw}))


def test_repeated_settings_share_one_checked_params_and_distinct_ones_do_not():
    node = Recorder()
    llm = NodeLLM(node, priority=3)
    ask(llm)
    ask(llm)
    ask(llm, temperature=0.5)
    ask(llm, temperature=0.5, seed=7)
    first, again, warm, seeded = (p for _, p in node.got)
    assert first is again                      # made once
    assert first == GenerateParams(max_tokens=4, priority=3)
    assert warm == GenerateParams(max_tokens=4, temperature=0.5, priority=3) and warm is not first
    assert seeded.seed == 7 and seeded is not warm


def test_a_kept_params_never_stands_in_for_a_value_of_another_type():
    node = Recorder()
    llm = NodeLLM(node)
    ask(llm, max_tokens=1, top_k=1)
    with pytest.raises(RequestRejected, match="max_tokens must be an int"):
        ask(llm, max_tokens=True, top_k=1)     # True == 1 and hashes alike: still refused
    with pytest.raises(RequestRejected, match="top_k must be an int"):
        ask(llm, max_tokens=1, top_k=1.0)
    ask(llm, temperature=1)
    assert type(node.got[-1][1].temperature) is float
    with pytest.raises(RequestRejected, match="max_tokens must be an int"):
        ask(llm, max_tokens=[1])  # unhashable: refused by GenerateParams, not a TypeError
    with pytest.raises(RequestRejected, match="temperature must be 0"):
        ask(llm, temperature=float("nan"))
    with pytest.raises(RequestRejected, match="temperature must be 0"):
        ask(llm, temperature=float("nan"))     # a refusal is never kept


def test_the_kept_settings_are_bounded():
    llm = NodeLLM(Recorder())
    for seed in range(3 * _MADE_PARAMS_MAX):
        ask(llm, seed=seed)
    assert 0 < len(llm._made) <= _MADE_PARAMS_MAX


def test_guided_settings_are_made_per_call():
    node = Recorder()
    llm = NodeLLM(node)
    ask(llm, choice=["a", "b"])
    ask(llm, choice=["a", "b"])
    ask(llm, json_schema={"type": "string"})
    a, b, c = (p for _, p in node.got)
    assert a == b and a.choice == ("a", "b") and c.json_schema == {"type": "string"}
    assert not llm._made


class Tok(enum.IntEnum):
    A = 5


@pytest.mark.parametrize("prompt", [[], [1, 2, 3], (4,), [Tok.A, 2], "text"])
def test_prompts_of_ints_or_text_are_taken(prompt):
    node = Recorder()
    asyncio.run(NodeLLM(node).generate(prompt, max_tokens=1))
    assert node.got[0][0] == prompt  # the handle passes it on; the node's submit checks it
    got = checked_prompt(prompt, 0, "n")
    assert got == (prompt if isinstance(prompt, str) else tuple(prompt))
    assert all(type(t) is int for t in got if not isinstance(prompt, str))


@pytest.mark.parametrize("prompt", [[1, True], [1.0], [1, "2"], {1: 2}, None, [[1]], "a\udc80b"])
def test_prompts_of_anything_else_are_refused(prompt):
    with pytest.raises(RequestRejected, match="prompt must be a string or a list of token "
                                              "ids|token ids are ints in"
                                              "|not valid Unicode"):
        checked_prompt(prompt, 0, "n")


def test_a_records_later_calls_are_queued_ahead_of_first_calls():
    """Inside a record (the runner sets CURRENT_RECORD), its k-th call goes at the job's priority
    minus (LATER_CALLS - k), its calls from the LATER_CALLS-th on at the job's own; outside one, the
    job's priority."""
    from forge.functions.llm import CURRENT_RECORD, LATER_CALLS, RecordCalls

    node = Recorder()
    llm = NodeLLM(node, priority=5)

    async def record():
        token = CURRENT_RECORD.set(RecordCalls())
        try:
            for _ in range(LATER_CALLS + 2):
                await llm.generate([1, 2], max_tokens=4)
            # guided: not kept, still counted
            await llm.generate([1, 2], max_tokens=4, choice=["a", "b"])
        finally:
            CURRENT_RECORD.reset(token)

    asyncio.run(record())
    assert [p.priority for _, p in node.got] == [
        5 - LATER_CALLS + k for k in range(LATER_CALLS)
    ] + [5] * 3
    ask(llm)
    assert node.got[-1][1].priority == 5                    # no record: the job's priority as given


def test_calls_a_record_makes_in_parallel_count_once_each():
    from forge.functions.llm import CURRENT_RECORD, RecordCalls

    node = Recorder()
    llm = NodeLLM(node)

    async def record():
        CURRENT_RECORD.set(RecordCalls())
        # tasks copy the context
        await asyncio.gather(*(llm.generate([1], max_tokens=2) for _ in range(3)))

    asyncio.run(record())
    assert sorted(p.priority for _, p in node.got) == [-3, -2, -1]
