"""VllmEngine through forge's Engine interface, in this process (one vLLM load for the file):
generate, token progress, guided choice / JSON / regex, cancel = abort, per-request seeds, embed
refused, per-step stats."""
from __future__ import annotations

import json
import time

import jsonschema
import pytest

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from forge.engines.interface import EngineBusy, EngineRequest, Guide, Sampling


@pytest.fixture(scope="module")
def engine():
    from forge.backends import factory

    plan = load_node(PACKAGED_NODES["local-vllm"]).plans[0]
    e = factory("vllm", card="cpu0")(plan.contract, plan)
    yield e
    e.shutdown(30)


def run(engine, requests, cancel=(), limit_s=120):
    engine.submit(requests)
    for key in cancel:
        engine.cancel(key)
    got, tokens, deadline = {}, 0, time.monotonic() + limit_s
    while len(got) < len(requests):
        assert time.monotonic() < deadline, (
            f"no result for {set(r.request_id for r in requests) - set(got)}"
        )
        t0 = time.monotonic()
        p = engine.poll(0.05)
        assert time.monotonic() - t0 < 5.0  # a poll is bounded (one step past its timeout at most)
        tokens += p.new_tokens
        got.update({r.request_id: r for r in p.results})
    return got, tokens


def prompt(engine, text="Alice was beginning to get very tired"):
    return tuple(engine.tokenizer.encode(text))


def test_the_engine_is_what_the_contract_says(engine):
    info = engine.describe()
    assert info["built"] == {
        "max_num_batched_tokens": 512,
        "max_num_seqs": 32,
        "max_model_len": 512,
        "block_size": 32,
        "num_gpu_blocks_override": 512,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "async_scheduling": False,
        "enforce_eager": True,
    }
    assert info["environment"]["VLLM_CPU_KVCACHE_SPACE"] is None
    assert info["load_s"] > 0
    # the broker keeps a prefix group together for it instead of serving longest output first across
    # groups
    assert engine.output_classes_first is False


def test_generate_greedy_with_token_progress(engine):
    got, tokens = run(
        engine, [EngineRequest("a", prompt(engine), 12), EngineRequest("b", prompt(engine), 12)]
    )
    assert got["a"].finish_reason in ("length", "eos") and 0 < len(got["a"].output_ids) <= 12
    assert got["a"].output_ids == got["b"].output_ids  # greedy: the same prompt, the same text
    assert tokens == len(got["a"].output_ids) + len(got["b"].output_ids)


def test_guided_choice_json_and_regex(engine):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    got, _ = run(engine, [
        EngineRequest("c", prompt(engine), 16, guide=Guide(choice=("yes", "no", "maybe"))),
        EngineRequest("j", prompt(engine), 64, guide=Guide(json_schema=schema)),
        EngineRequest("r", prompt(engine), 16, guide=Guide(regex="[0-9]{3}-[0-9]{2}"))])
    assert engine.tokenizer.decode(got["c"].output_ids) in ("yes", "no", "maybe")
    jsonschema.validate(json.loads(engine.tokenizer.decode(got["j"].output_ids)), schema)
    import re

    assert re.fullmatch("[0-9]{3}-[0-9]{2}", engine.tokenizer.decode(got["r"].output_ids))


def test_cancel_aborts_and_answers_with_the_tokens_so_far(engine):
    engine.submit([EngineRequest("long", prompt(engine), 120, Sampling(stop_at_eos=False))])
    produced = 0
    while produced == 0:
        produced += engine.poll(0.05).new_tokens
    engine.cancel("long")
    p = engine.poll(0.05)
    (res,) = [r for r in p.results if r.request_id == "long"]
    assert res.finish_reason == "cancelled" and 0 < len(res.output_ids) < 120
    assert engine.poll(0.05).results == []  # nothing of it comes back later
    # the same id runs again afresh
    again, _ = run(engine, [EngineRequest("long", prompt(engine), 4)])
    assert again["long"].finish_reason in ("length", "eos")


def test_seeds_same_seed_same_text_different_seeds_differ(engine):
    hot = lambda seed: Sampling(temperature=1.0, seed=seed)  # noqa: E731
    got, _ = run(engine, [EngineRequest(f"s{i}", prompt(engine), 24, hot(seed))
                          for i, seed in enumerate((7, 7, 8, 9))])
    assert got["s0"].output_ids == got["s1"].output_ids
    assert len({tuple(got[k].output_ids) for k in ("s0", "s2", "s3")}) == 3


def test_embed_and_impossible_requests_are_refused_in_one_line(engine):
    got, _ = run(
        engine,
        [
            EngineRequest("h", prompt(engine), 1, want_hidden=True),
            EngineRequest("big", tuple([5] * 385), 8),
            EngineRequest("hot", prompt(engine), 8, Sampling(temperature=float("nan"))),
        ],
    )
    assert {k: r.finish_reason for k, r in got.items()} == {
        "h": "refused",
        "big": "refused",
        "hot": "refused",
    }
    assert got["h"].error.startswith("embed needs a pooling tier") and "\n" not in got["h"].error
    assert "max_input_len 384" in got["big"].error


def test_submit_beyond_the_engine_capacity_is_busy(engine):
    with pytest.raises(EngineBusy):
        engine.submit([EngineRequest(f"x{i}", prompt(engine), 4) for i in range(65)])


def test_stats_report_steps_kv_and_prefix_hits(engine):
    shared = tuple(engine.tokenizer.encode("The Queen of Hearts, she made some tarts, all on a "
                                           "summer day: " * 3))
    before = engine.stats()
    run(engine, [EngineRequest("p1", shared + (5,), 4)])
    run(engine, [EngineRequest("p2", shared + (6,), 4)])
    after = engine.stats()
    assert after.steps > before.steps
    # at least one whole block reused
    assert after.prefix_hit_tokens - before.prefix_hit_tokens >= 32
    assert after.kv_blocks_used + after.kv_blocks_free == 512
    assert after.preemptions == 0
    # forge's logger is the only one: vLLM added its Prometheus logger (every step, on this thread)
    # until it was given one of that kind (forge/engines/vllm/engine.py::stat_logger_class)
    assert [type(x).__name__ for x in engine._engine.logger_manager.stat_loggers] == [
        "ForgeStatLogger"
    ]


def test_a_request_ended_by_eos_hands_back_text_tokens_only(engine):
    """vLLM keeps the EOS it stopped at in its ids; forge's output_ids carry text tokens only, as
    the transformers engine's do (the reason says it ended), so both backends count the same output
    tokens."""
    eos = engine.tokenizer.eos_token_id
    got, _ = run(engine, [EngineRequest("b", prompt(engine, "The Mock Turtle said"), 64),
                          EngineRequest("e", prompt(engine, "The Mock Turtle said"), 24,
                                        sampling=Sampling(stop_at_eos=False))])
    assert got["b"].finish_reason == "eos" and 0 < len(got["b"].output_ids) < 64, got["b"]
    assert eos not in got["b"].output_ids, got["b"].output_ids
    assert got["e"].finish_reason == "length" and len(got["e"].output_ids) == 24


def test_a_higher_priority_request_takes_the_next_free_slot_ahead_of_queued_work(engine):
    """forge keeps up to max_batch_size requests waiting inside vLLM (docs/admission.md): an online
    request (higher priority) must not wait behind them. 32 bulk requests run, ending one a step
    (lengths 8, 9, ...); 31 more wait; the online one, submitted last, is scheduled at the first
    free slot, not after the 31."""
    never_eos = Sampling(stop_at_eos=False)
    bulk = [EngineRequest(f"b{i}", prompt(engine), 8 + i, never_eos) for i in range(63)]
    engine.submit(bulk)
    engine.submit([EngineRequest("online", prompt(engine), 4, never_eos, priority=10)])
    order, deadline = [], time.monotonic() + 120
    while len(order) < 64:
        assert time.monotonic() < deadline, f"{64 - len(order)} request(s) never finished"
        order += [r.request_id for r in engine.poll(0.05).results]
    # last in FCFS order, it would end after ~31 bulk requests
    assert order.index("online") < 8, order
    assert engine.stats().preemptions == 0


CATEGORIES = ("outdoor", "kitchen", "electronics", "fitness", "other")


def test_a_choice_is_spelled_in_the_tokenizers_own_tokens_within_max_tokens(engine):
    """vLLM's `choice` grammar lets a model spell a choice in more tokens than its tokenizer gives
    it (issue 49: 'electronic' cut at max_tokens 8). forge's guide allows only each choice's own
    tokens, so max_tokens 8 holds every category here (the longest, "electronics", is 7 tokens), hot
    sampling included."""
    canonical = {
        tuple(engine.tokenizer.hf.encode(c, add_special_tokens=False)): c for c in CATEGORIES
    }
    assert max(len(ids) for ids in canonical) <= 8
    texts = [
        "waterproof camping tent",
        "steel kettle for the kitchen",
        "wireless headphones",
        "yoga mat",
        "a lantern",
        "the blender",
        "phone charger",
        "heavy dumbbell",
    ]
    requests = [EngineRequest(f"c{i}", prompt(engine, f"Product: {t}\nCategory:"), 8,
                              Sampling(temperature=1.0), guide=Guide(choice=CATEGORIES))
                for i, t in enumerate(texts * 6)]
    got, _ = run(engine, requests)
    for key, res in got.items():
        assert tuple(res.output_ids) in canonical, (
            key,
            res.output_ids,
            engine.tokenizer.decode(res.output_ids),
        )
    # the sampling chose, not the guide
    assert len({canonical[tuple(r.output_ids)] for r in got.values()}) >= 2


def test_a_choice_max_tokens_cannot_hold_is_refused_before_it_runs_naming_the_choice_and_card(
    engine,
):
    choices = CATEGORIES[:4]  # "other" is one token; these are 3 or more
    shortest = min(len(engine.tokenizer.hf.encode(c, add_special_tokens=False)) for c in choices)
    got, _ = run(
        engine,
        [
            EngineRequest("short", prompt(engine), shortest - 1, guide=Guide(choice=choices)),
            EngineRequest("fits", prompt(engine), shortest, guide=Guide(choice=choices)),
        ],
    )
    assert got["short"].finish_reason == "refused" and "\n" not in got["short"].error
    assert "'outdoor'" in got["short"].error and "card cpu0" in got["short"].error
    assert f"max_tokens {shortest - 1} cannot hold the shortest choice" in got["short"].error
    assert engine.tokenizer.decode(got["fits"].output_ids) in choices


# JSON schemas vLLM's xgrammar backend refuses at add_request (VLLMValidationError, which is no
# ValueError): issue 48
UNCOMPILABLE = {
    "uniqueItems": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}},
    "format+maxLength": {"type": "string", "format": "email", "maxLength": 20},
    "int64": {"type": "integer", "minimum": 2**70},
}


def test_a_schema_the_backend_cannot_compile_is_that_requests_refusal_not_the_engines(engine):
    good = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False}
    requests = [EngineRequest(name, prompt(engine), 32, guide=Guide(json_schema=schema))
                for name, schema in UNCOMPILABLE.items()]
    got, _ = run(
        engine,
        requests + [EngineRequest("good", prompt(engine), 32, guide=Guide(json_schema=good))],
    )
    for name in UNCOMPILABLE:
        assert got[name].finish_reason == "refused", (name, got[name])
        assert (
            got[name].error.startswith("vLLM refused the request") and "\n" not in got[name].error
        )
    assert got["good"].finish_reason in ("eos", "length")
    jsonschema.validate(json.loads(engine.tokenizer.decode(got["good"].output_ids)), good)
    again, _ = run(engine, [EngineRequest("after", prompt(engine), 4)])      # the engine lives on
    assert again["after"].finish_reason in ("eos", "length")
