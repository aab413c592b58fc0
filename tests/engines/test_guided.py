"""Guided output on the real tiny engine: every choice result is a member, every json_schema result
parses and matches its schema — with greedy and sampled decoding, and under max_tokens pressure down
to the shortest output the guide allows (below it, the request is refused up front)."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from forge.engines.interface import REFUSED, EngineRequest, Guide, Sampling
from tests.installed import skip_module_unless_installed

pytestmark = pytest.mark.engine
skip_module_unless_installed("torch", "transformers", "llguidance")

from tests.engines.test_transformers_backend import TINY, contract, run_all, start  # noqa: E402

PROMPTS = [
    "Alice was beginning to",
    "The Mock Turtle said",
    "Down the Rabbit-Hole",
    "`Off with her head!' the Queen",
    "1, 2, 3, 4, 5, 6, 7,",
    "The King and Queen of Hearts were seated on their throne",
]
CHOICES = ("yes", "no", "the Queen", "the Queen of Hearts", "the King", "a very long answer about "
                                                                        "the March Hare")
SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "who": {"enum": ["Alice", "the Hatter", "the Dormouse"]},
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "maxItems": 4,
            },
            "where": {
                "type": "object",
                "properties": {
                    "place": {"type": "string", "maxLength": 12},
                    "indoors": {"type": "boolean"},
                },
                "required": ["place", "indoors"],
            },
            "note": {"type": "string"},
        },
        "required": ["who", "scores", "where"],
    },
    {"type": "array", "items": {"type": "string"}, "minItems": 1},
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "number"},
            "tags": {"type": "array", "items": {"enum": ["red", "white", "rose"]}},
        },
        "required": ["ok", "n", "tags"],
    },
]


@pytest.fixture(scope="module")
def engine():
    eng = start(contract(TINY))
    yield eng
    eng.shutdown(10)


def run_batches(engine, requests, size=48):
    got = {}
    for i in range(0, len(requests), size):
        got.update(run_all(engine, requests[i:i + size], timeout_s=120)[0])
    return got


def ids(engine, text):
    return tuple(engine.tokenizer.encode(text))


def shortest(engine, guide) -> int:
    got, _ = run_all(engine, [EngineRequest("probe", ids(engine, "x"), 1, guide=guide)])
    r = got["probe"]
    if r.finish_reason != REFUSED:
        return 1
    return int(re.search(r"\((\d+) tokens", r.error).group(1))


def test_engine_says_which_guides_it_supports(engine):
    assert engine.supports_guides == {"choice", "json_schema"}
    assert engine.describe()["guides"] == ["choice", "json_schema"]


def test_choice_results_are_always_members(engine):
    need = shortest(engine, Guide(choice=CHOICES))
    reqs = []
    for i in range(72):
        budget = [need, need + 1, 4, 8, 16, 64][i % 6]
        sampling = Sampling(temperature=[0.0, 1.0, 1.5][i % 3])
        reqs.append(EngineRequest(f"c{i}", ids(engine, PROMPTS[i % len(PROMPTS)]), budget,
                                  guide=Guide(choice=CHOICES), sampling=sampling))
    got = run_batches(engine, reqs)
    texts = set()
    for r in reqs:
        res = got[r.request_id]
        assert res.finish_reason in ("eos", "length") and res.error is None, res
        text = engine.tokenizer.decode(res.output_ids)
        assert text in CHOICES, (text, r.max_new_tokens)
        assert len(res.output_ids) <= r.max_new_tokens
        texts.add(text)
    assert len(texts) >= 2                 # sampled requests really choose


@pytest.mark.parametrize("schema_index", range(len(SCHEMAS)))
def test_json_results_always_parse_and_match(engine, schema_index):
    schema = SCHEMAS[schema_index]
    need = shortest(engine, Guide(json_schema=schema))
    reqs = []
    for i in range(48):
        budget = [need, need + 1, need + 3, need + 8, 48, 128][i % 6]
        reqs.append(
            EngineRequest(
                f"j{i}",
                ids(engine, PROMPTS[i % len(PROMPTS)] + " As JSON:"),
                min(budget, 128),
                guide=Guide(json_schema=schema),
                sampling=Sampling(temperature=[0.0, 1.0][i % 2]),
            )
        )
    got = run_batches(engine, reqs)
    for r in reqs:
        res = got[r.request_id]
        assert res.error is None, (res.error, r.max_new_tokens, need)
        value = json.loads(engine.tokenizer.decode(res.output_ids))
        jsonschema.validate(value, schema)
        assert len(res.output_ids) <= r.max_new_tokens


def test_budgets_below_the_shortest_output_are_refused_up_front(engine):
    choice, schema = Guide(choice=("the Queen of Hearts",)), Guide(json_schema=SCHEMAS[1])
    n_choice, n_json = shortest(engine, choice), shortest(engine, schema)
    assert n_choice > 1 and n_json > 5
    got, _ = run_all(engine, [EngineRequest("c", ids(engine, "x"), n_choice - 1, guide=choice),
                              EngineRequest("j", ids(engine, "x"), n_json - 1, guide=schema),
                              EngineRequest("c-fits", ids(engine, "x"), n_choice, guide=choice),
                              EngineRequest("j-fits", ids(engine, "x"), n_json, guide=schema)])
    assert got["c"].finish_reason == REFUSED and "cannot hold the shortest choice" in got["c"].error
    assert (
        got["j"].finish_reason == REFUSED and "shortest JSON this schema allows" in got["j"].error
    )
    assert engine.tokenizer.decode(got["c-fits"].output_ids) == "the Queen of Hearts"
    jsonschema.validate(json.loads(engine.tokenizer.decode(got["j-fits"].output_ids)), SCHEMAS[1])


def test_what_the_engine_cannot_guide_is_refused(engine):
    got, _ = run_all(
        engine,
        [
            EngineRequest("re", ids(engine, "x"), 8, guide=Guide(regex="a+")),
            EngineRequest(
                "two",
                ids(engine, "x"),
                8,
                guide=Guide(choice=("a",), json_schema={"type": "string"}),
            ),
            EngineRequest(
                "bad", ids(engine, "x"), 8, guide=Guide(json_schema={"type": "nonsense"})
            ),
            EngineRequest(
                "noeos",
                ids(engine, "x"),
                8,
                guide=Guide(choice=("a",)),
                sampling=Sampling(stop_at_eos=False),
            ),
        ],
    )
    assert "regex is not supported" in got["re"].error
    assert "exactly one" in got["two"].error
    assert "cannot be compiled" in got["bad"].error
    assert "stop at EOS" in got["noeos"].error
    assert all(r.finish_reason == REFUSED for r in got.values())


def test_unguided_requests_are_untouched(engine):
    """The guide processor sits in every step; requests without a guide decode exactly as before."""
    from forge.engines.transformers import guided

    r = EngineRequest("plain", ids(engine, PROMPTS[0]), 24)
    first, _ = run_all(engine, [r])
    mixed, _ = run_all(
        engine,
        [
            EngineRequest("plain", ids(engine, PROMPTS[0]), 24),
            EngineRequest("g", ids(engine, PROMPTS[1]), 24, guide=Guide(choice=CHOICES)),
        ],
    )
    assert mixed["plain"].output_ids == first["plain"].output_ids
    # nothing left
    assert len(engine._guides[1]) == 0 and isinstance(engine._guides[1], guided.GuideProcessor)


def test_choice_trie_counts_the_fewest_tokens_to_a_choice():
    # imports torch, transformers: not at collection
    from forge.engines.transformers.guided import ChoiceTrie

    trie = ChoiceTrie([(1, 2, 3), (1, 2), (4,), (5, 6, 7, 8)])
    assert trie.need[0] == 1                                   # (4,)
    node12 = trie.children[trie.children[0][1]][2]
    assert trie.terminal[node12] and trie.need[node12] == 0
    assert trie.need[trie.children[0][5]] == 3


def test_strict_objects_only_narrows():
    from forge.engines.transformers.guided import guide_kind, strict_objects

    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {}}},
            "e": {"enum": [{"properties": 1}]},
        },
        "$defs": {"x": {"properties": {"b": {}}}},
    }
    out = strict_objects(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in out["properties"]  # a map of names, not a schema
    assert out["properties"]["e"]["enum"] == [{"properties": 1}]           # data is left alone
    assert out["$defs"]["x"]["additionalProperties"] is False
    assert guide_kind(Guide(choice=("a",))) == "choice" and guide_kind(Guide()) is None


def test_guides_need_the_eager_loop():
    from forge.engines.transformers.factory import guides_unavailable
    from forge.engines.transformers.backend import TransformersSection

    assert guides_unavailable(TransformersSection()) == ""
    why = guides_unavailable(TransformersSection(use_cuda_graph=True, compile_level=2))
    assert (
        "transformers.use_cuda_graph (the CUDA graph captures the logits processors" in why
        and "compile_level" in why
    )
    assert "silently ignored" in why and "async" not in why
    why = guides_unavailable(TransformersSection(async_batching=True))
    assert why.startswith("guided output needs the eager loop; this contract sets "
                          "transformers.async_batching")
    assert "one token behind" in why
