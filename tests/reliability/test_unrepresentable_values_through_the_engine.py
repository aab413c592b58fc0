"""One request never kills a node (issue 13, item 2): every number a generate call carries is
checked against what the engines can represent where it enters (GenerateParams), again at the
engine's submit, and once more inside the transformers loop's own per-request check. Real tiny
model, real transformers engine."""
from __future__ import annotations

import json
import math
import time

import pytest

from forge.errors import RequestRejected
from forge.functions.api import GenerateParams
from tests.installed import skip_module_unless_installed
from tests.reliability._rel import assert_complete, assert_no_traceback, forge, record_figures

BAD = [
    (dict(top_k=2**31), "top_k must be an int in [0, 2**31 - 1]"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=True), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(max_tokens=2**31), "max_tokens must be an int in [1, 2**31 - 1]"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=math.nan), "temperature must be 0 (greedy) or a number in [0.01, 10000]"),
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature=1e-30), "temperature"),
    (dict(temperature=1e300), "temperature"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature="0.7"), "temperature"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=math.nan), "top_p"),
    (dict(seed=2**63), "seed must be an int in [0, 2**63)"),
    (dict(seed=-1), "seed"),
    (dict(priority=2**31), "priority"),
    (dict(deadline_s=math.nan), "deadline_s"),
    (dict(deadline_s=math.inf), "deadline_s"),
    (dict(deadline_s=0), "deadline_s"),
    (dict(choice="yes"), "choice must be a non-empty list"),
    (dict(choice=()), "choice must be a non-empty list"),
    (dict(choice=("a", "")), "choice must be a non-empty list"),
    (dict(choice=tuple(str(i) for i in range(5000))), "choice has 5000 options"),
    (dict(choice=("x" * 300_000,)), "bytes in all"),
    (dict(choice=("a",), json_schema={"type": "string"}), "not both"),
    (dict(json_schema=[1]), "json_schema must be a JSON object"),
    (dict(json_schema={"type": "object", "enum": {1, 2}}), "json_schema is not JSON"),
    (dict(json_schema={"const": math.nan}), "json_schema is not JSON"),
    (dict(json_schema={"description": "d" * 300_000}), "bytes as JSON"),
]


@pytest.mark.parametrize(
    "kw, message", BAD, ids=[f"{list(k)[0]}={str(list(k.values())[0])[:12]}" for k, _ in BAD]
)
def test_values_no_engine_can_represent_are_refused_where_they_enter(kw, message):
    with pytest.raises(RequestRejected) as err:
        GenerateParams(**{"max_tokens": 8, **kw})
    assert message in str(err.value)


def test_a_cyclic_schema_is_refused():
    schema: dict = {"type": "object"}
    schema["properties"] = {"self": schema}
    with pytest.raises(RequestRejected, match="json_schema is not JSON"):
        GenerateParams(max_tokens=8, json_schema=schema)


def test_the_values_at_the_edges_are_taken():
    p = GenerateParams(
        max_tokens=2**31 - 1,
        top_k=2**31 - 1,
        temperature=0.01,
        top_p=1e-300,
        seed=2**63 - 1,
        priority=-(2**31 - 1),
        deadline_s=1e-3,
    )
    assert isinstance(p.temperature, float) and p.top_k == 2**31 - 1
    assert GenerateParams(max_tokens=1, temperature=1).temperature == 1.0


# --- the engine
# ------------------------------------------------------------------------------------------------
skip_module_unless_installed("torch", "transformers")


@pytest.fixture(scope="module")
def engine():
    from tests.engines.test_transformers_backend import TINY, contract, start

    eng = start(contract(TINY))
    yield eng
    eng.shutdown(10)


def _answer(engine, requests, timeout_s=30.0):
    from tests.engines.test_transformers_backend import run_all

    return run_all(engine, requests, timeout_s)[0]


@pytest.mark.engine
def test_the_engine_refuses_what_its_loop_cannot_take_and_keeps_working(engine):
    """Past the node's edge (a plugin, a future caller): the engine's submit checks again; the loop
    lives."""
    from forge.engines.interface import REFUSED, EngineRequest, Sampling

    ids = tuple(engine.tokenizer.encode("Alice was beginning to"))
    bad = [
        Sampling(temperature=0.7, top_k=2**31),
        Sampling(temperature=1e-45),
        Sampling(temperature=math.nan),
        Sampling(temperature=0.7, top_p=math.nan),
    ]
    got = _answer(
        engine,
        [EngineRequest(f"bad{i}", ids, 4, sampling=s) for i, s in enumerate(bad)]
        + [
            EngineRequest("big-k", ids, 4, sampling=Sampling(temperature=0.7, top_k=10**6)),
            EngineRequest("ok", ids, 4),
        ],
    )
    for i in range(len(bad)):
        assert got[f"bad{i}"].finish_reason == REFUSED and got[f"bad{i}"].error.startswith(
            "invalid sampling"
        )
    # top_k past the vocab
    assert got["big-k"].finish_reason == "length" and len(got["big-k"].output_ids) == 4
    assert got["ok"].finish_reason == "length"
    assert engine._loop_dead() is None


@pytest.mark.engine
def test_a_bad_value_inside_the_loop_fails_that_request_alone(engine):
    """The last layer: a request handed straight to transformers' manager with top_k 2**31 (what
    killed the loop before) fails alone in the loop's per-request check; the loop then serves the
    next request."""
    ids = list(engine.tokenizer.encode("Alice was beginning to"))
    manager = engine._manager
    manager.add_request(ids, request_id="raw-bad", max_new_tokens=4, streaming=False, top_k=2**31,
                        temperature=0.7, top_p=1.0)
    deadline, out = time.monotonic() + 30, None
    while out is None and time.monotonic() < deadline:
        r = manager.get_result(request_id="raw-bad", timeout=0.1)
        if r is not None and r.is_finished():
            out = r
    assert out is not None and out.error is not None and "top_k 2147483648" in str(out.error)
    assert engine._loop_dead() is None
    from forge.engines.interface import EngineRequest

    got = _answer(engine, [EngineRequest("after", tuple(ids), 4)])
    assert got["after"].finish_reason == "length" and len(got["after"].output_ids) == 4


# --- forge run, end to end
# -------------------------------------------------------------------------------------
POISON = '''
import forge

@forge.function(max_output_tokens=4)
async def poison(record: dict, llm: forge.LLM) -> dict:
    top_k = 2**31 if record["id"] == 117 else 0
    out = await llm.generate(f"Say: record {record['id']}", max_tokens=4, temperature=0.7, top_k=top_k)
    return {"id": record["id"], "text": out.text}
'''


@pytest.mark.engine
def test_top_k_2_to_the_31_fails_one_record_of_200_on_the_real_engine(tmp_path):
    (tmp_path / "poison.py").write_text(POISON)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(200)))
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        tmp_path / "poison.py",
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        timeout=600,
    )
    assert_no_traceback(r.stderr)
    rows = {row["index"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == list(range(200))
    assert [i for i, row in rows.items() if "error" in row] == [117]
    assert (
        rows[117]["error"]["type"] == "RequestRejected" and "top_k" in rows[117]["error"]["message"]
    )
    assert all(rows[i]["result"]["id"] == i for i in rows if i != 117)
    assert_complete(out, tmp_path / "out.jsonl.ledger.sqlite", 200)
    record_figures(
        "top-k-2-31-real",
        records=200,
        error_rows=1,
        results=199,
        exit_code=r.returncode,
        message=rows[117]["error"]["message"],
    )


# --- a provisioned node, over HTTP
# -----------------------------------------------------------------------------
@pytest.mark.engine
def test_a_prompt_no_tokenizer_takes_fails_its_item_at_the_nodes_edge(tmp_path):
    """`forge provision` of the real tiny model; raw JSON to its /v1/generate (a client other than
    forge deploy, which refuses such a prompt before sending). A lone surrogate, or token ids past
    int32, is that item's RequestRejected with the prompt's problem; the rest of the batch is
    answered, the node serves on. (i13's node answered the whole batch 500: the prompt reached the
    tokenizer.)"""
    import httpx

    from forge.embedded import default_node_path
    from tests.reliability.test_security import Node

    node = Node(tmp_path, default_node_path())
    try:
        body = (b'{"requests": [{"prompt": "a\\ud800b", "max_tokens": 2}, {"prompt": "Alice", "max_tokens": 2},'
                b' {"prompt": [1, 2, 2147483648], "max_tokens": 2}, {"prompt": "\\udfff", "max_tokens": 2,'
                b' "embed": true}]}')
        r = httpx.post(
            node.local + "/v1/generate",
            content=body,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        surrogate, good, ids, embed = r.json()["results"]
        assert surrogate["error"] == {"type": "RequestRejected", "message": "prompt is not valid "
                                                                            "Unicode text: "
                                      "a lone surrogate (U+D800) at character 1"}, surrogate
        assert good["output_tokens"] == 2 and good["finish_reason"] == "length", good
        assert (
            ids["error"]["type"] == "RequestRejected"
            and "prompt token 2 is 2147483648" in ids["error"]["message"]
        )
        assert (
            embed["error"]["type"] == "RequestRejected" and "U+DFFF" in embed["error"]["message"]
        ), embed
        assert httpx.get(node.local + "/health", timeout=30).json()["status"] == "ok"
    finally:
        assert node.stop() == 0
    assert_no_traceback(node.err.read_text())
