"""The instant backend (no model) and the faults wrapper, called directly through the Engine
interface."""
from __future__ import annotations

import time

import pytest

from tests.host._admission_harness import TINY, contract, faulty, instant, plan
from forge.config.load import load_paths
from forge.config.plan import plan_card
from forge.config.models import Card
from forge.engines.interface import EngineBusy, EngineFailed, EngineRequest, Guide
from forge.errors import ForgeError
from forge.backends import factories as backend_factories
from forge_bench.engines.instant import (
    ByteTokenizer,
    InstantEngine,
    InstantSection,
    JsonTokenizer,
    synthetic_output,
)

pytestmark = pytest.mark.timeout(20)


def req(i: int, n_in: int = 10, n_out: int = 8, **kw) -> EngineRequest:
    return EngineRequest(
        request_id=f"q{i}", prompt_ids=tuple(range(3, 3 + n_in)), max_new_tokens=n_out, **kw
    )


def drain(eng, n: int, timeout_s: float = 5.0):
    out, tokens, end = [], 0, time.monotonic() + timeout_s
    while len(out) < n:
        assert time.monotonic() < end, f"only {len(out)} of {n} results"
        p = eng.poll(0.05)
        out += p.results
        tokens += p.new_tokens
    return out, tokens


def test_instant_answers_deterministically_and_reports_tokens():
    c = contract(slots=4)
    eng = instant(c, plan(c))
    eng.submit([req(0), req(1, n_in=5, n_out=3)])
    results, tokens = drain(eng, 2)
    assert tokens == 11
    by_id = {r.request_id: r for r in results}
    assert by_id["q0"].output_ids == synthetic_output(tuple(range(3, 13)), 8, 3, 2048)
    assert by_id["q1"].finish_reason == "length" and len(by_id["q1"].output_ids) == 3
    assert all(3 <= t < 2048 for r in results for t in r.output_ids)
    assert "no model" in eng.describe()["label"]
    eng.shutdown(1)
    with pytest.raises(EngineFailed):
        eng.submit([req(2)])


def test_instant_refuses_beyond_its_slots_and_kv_blocks():
    c = contract(slots=2, kv_tokens=64, tpb=32)            # 2 blocks
    eng = instant(c, plan(c))
    with pytest.raises(EngineBusy):
        eng.submit([req(0), req(1), req(2)])                # 3 > 2 slots
    with pytest.raises(EngineBusy):
        eng.submit([req(0, n_in=40, n_out=30)])             # 70 tokens = 3 blocks > 2
    eng.submit([req(0), req(1)])
    assert eng.stats().active == 2 and eng.stats().kv_blocks_free == 0


def test_instant_rate_limit_and_cancel():
    c = contract(slots=4)
    eng = instant(c, plan(c), rate=400)                     # 4 requests x 50 tokens = 0.5 s
    t0 = time.monotonic()
    eng.submit([req(i, n_in=10, n_out=40) for i in range(4)])
    eng.cancel("q3")
    results, _ = drain(eng, 4)
    took = time.monotonic() - t0
    assert 0.25 < took < 2.0
    assert {r.request_id: r.finish_reason for r in results}["q3"] == "cancelled"
    # FIFO
    assert [r.request_id for r in results if r.finish_reason == "length"] == ["q0", "q1", "q2"]


def test_instant_errors_for_what_it_cannot_do():
    c = contract(slots=4, max_in=16)
    eng = instant(c, plan(c))
    eng.submit([req(0, n_in=20), req(1, guide=Guide(choice=("a", "b")))])
    results, _ = drain(eng, 2)
    errors = {r.request_id: r.error for r in results}
    assert "max_input_len 16" in errors["q0"] and "guided" in errors["q1"]
    assert all(r.finish_reason == "error" for r in results)


def test_instant_tokenizer_is_the_checkpoints_or_bytes(tmp_path):
    c = contract()
    tok = instant(c, plan(c)).tokenizer
    assert isinstance(tok, JsonTokenizer) and tok.eos_token_id == 2
    ids = tok.encode("Hello world")
    assert ids[0] == 1 and tok.decode(ids) == "Hello world"
    bare = c.model_copy(
        update={"artifact": c.artifact.model_copy(update={"checkpoint": str(tmp_path)})}
    )
    tok = InstantEngine(bare, plan(bare)).tokenizer
    assert isinstance(tok, ByteTokenizer) and tok.decode(tok.encode("héllo")) == "héllo"


def test_faults_refuse_then_accept():
    c = contract(slots=4)
    eng = faulty(c, plan(c), refuse_first_submits=2)
    for _ in range(2):
        with pytest.raises(EngineBusy):
            eng.submit([req(0)])
    eng.submit([req(0)])
    assert len(drain(eng, 1)[0]) == 1


def test_faults_freeze_is_exact_and_recovers():
    c = contract(slots=8)
    eng = faulty(c, plan(c), freeze_after_requests=3, freeze_for_s=0.3)
    eng.submit([req(i) for i in range(5)])
    first, _ = drain(eng, 3)
    assert len(first) == 3
    stats = eng.stats()
    t0 = time.monotonic()
    p = eng.poll(0.1)
    # honours its timeout
    assert p.results == [] and p.new_tokens == 0 and 0.08 < time.monotonic() - t0 < 0.5
    assert eng.stats() == stats                             # frozen stats
    rest, _ = drain(eng, 2, timeout_s=2.0)
    assert {r.request_id for r in first + rest} == {f"q{i}" for i in range(5)}


def test_faults_crash_after_exactly_n_results():
    c = contract(slots=8)
    eng = faulty(c, plan(c), crash_after_requests=2)
    eng.submit([req(i) for i in range(4)])
    assert len(drain(eng, 2)[0]) == 2
    with pytest.raises(EngineFailed):
        eng.poll(0.01)
    with pytest.raises(EngineFailed):
        eng.submit([req(9)])


def test_faults_slow_factor_stretches_each_request():
    c = contract(slots=4)
    fast = instant(c, plan(c), rate=1000)
    slow = faulty(c, plan(c), rate=1000, slow_factor=3.0)
    times = []
    for eng in (fast, slow):
        t0 = time.monotonic()
        eng.submit([req(0, n_in=10, n_out=90)])             # 100 tokens at 1000/s = 0.1 s
        drain(eng, 1)
        times.append(time.monotonic() - t0)
    assert times[1] > 2.0 * times[0]


def _tiny_contract(name: str, backend: str, sections: str) -> str:
    """A contract of the tiny model's geometry for `backend`, with its own sections (YAML)
    appended."""
    return f"""contract: {name}
backend: {backend}
model: {{architecture: LlamaForCausalLM, num_layers: 4, num_kv_heads: 4, head_dim: 32, vocab_size: 2048,
         weights_gib: 0.011}}
artifact: {{checkpoint: {TINY}}}
precision: {{weights: fp32, kv_cache: fp32}}
limits: {{max_batch_size: 4, max_num_tokens: 512, max_input_len: 384, max_output_len: 128}}
kv_cache: {{tokens_per_block: 32, max_tokens: 4096, host_cache_size: 0, block_reuse: true}}
target: {{kind: cpu}}
{sections}
"""


def test_faults_contract_loads_and_builds_through_the_plugins(tmp_path):
    sections = ("faults: {wraps: instant, crash_after_requests: 1}\ninstant: {tokens_per_s_limit: "
                "5000}")
    (tmp_path / "f.yaml").write_text(_tiny_contract("flaky", "faults", sections))
    loaded = load_paths([tmp_path / "f.yaml"])
    assert loaded.ok, [p.render() for p in loaded.problems]
    c = loaded.contracts["flaky"]
    p = plan_card(Card(index=0, kind="cpu", model="cpu", memory_gib=2, engine="flaky"), c)
    factories = backend_factories()
    eng = factories["faults"](c, p)
    assert eng.describe()["inner"]["tokens_per_s_limit"] == 5000
    eng.submit([req(0)])
    drain(eng, 1)
    with pytest.raises(EngineFailed):
        eng.poll(0.01)
    bad = c.model_copy(update={"sections": {"faults": {"wraps": "nope", "slow_factor": 2.0}}})
    with pytest.raises(ForgeError, match=r"\$\.faults\.wraps: unknown backend 'nope'"):
        factories["faults"](bad, p)


@pytest.mark.parametrize("section, message", [
    ({"wraps": "faults", "slow_factor": 2.0}, "cannot wrap itself"),
    ({"wraps": "instant"}, "names no fault"),
    ({"wraps": "instant", "freeze_for_s": 1.0}, "needs freeze_after_requests"),
    ({"wraps": "instant", "slow_factor": 0.5}, "greater than or equal to 1"),
])
def test_faults_section_refuses_nonsense(section, message):
    c = contract().model_copy(update={"sections": {"faults": section}})
    factories = backend_factories()
    with pytest.raises(ForgeError, match=message):
        factories["faults"](c, plan(c))


# ---------------------------------------------------------------- the step model (instant:
# {step_cpu_ms: X})
def stepper(c, cpu_ms: float = 1.0) -> InstantEngine:
    return InstantEngine(c, plan(c), InstantSection(step_cpu_ms=cpu_ms))


def test_step_engine_prefills_then_decodes_one_token_per_request_per_step():
    c = contract(slots=4)  # budget 512: all four prompts prefill in one step
    eng = stepper(c)
    eng.submit([req(i, n_in=10, n_out=8) for i in range(4)])
    results, tokens = drain(eng, 4)
    assert tokens == 32 and all(
        len(r.output_ids) == 8 and r.finish_reason == "length" for r in results
    )
    assert results[0].output_ids == synthetic_output(tuple(range(3, 13)), 8, 3, 2048)
    st = eng.stats()
    # one prefill step, eight decode steps of 4 tokens
    assert st.steps == 1 + 8 and st.tokens_last_step == 4


def test_step_engine_budget_chunks_prefill_and_caps_every_step():
    c = contract(slots=4).model_copy(
        update={"limits": contract().limits.model_copy(update={"max_num_tokens": 16})}
    )
    eng = stepper(c)
    eng.submit([req_ids(i, range(100 * i + 3, 100 * i + 13), n_out=2) for i in range(4)])
    # budget 16; decode goes first, then prefill in arrival order: step 1: p0 10 + p1 6 | 2: d0, p1
    # 4, p2 10, p3 1 | 3: d0 (done), d1, d2, p3 9 | 4: d1, d2 (done), d3 | 5: d3
    seen = []
    while len(seen) < 4:
        seen += eng.poll(0.05).results
        if eng.stats().steps == 3:
            assert eng.stats().tokens_last_step == 12
    assert eng.stats().steps == 5 and eng.stats().tokens_last_step == 1
    assert all(len(r.output_ids) == 2 for r in seen)


def req_ids(i: int, ids, n_out: int = 4) -> EngineRequest:
    return EngineRequest(request_id=f"q{i}", prompt_ids=tuple(ids), max_new_tokens=n_out)


def test_step_engine_reuses_cached_prefix_blocks_and_counts_them():
    c = contract(slots=4, tpb=32)
    eng = stepper(c)
    head = list(range(3, 3 + 64))                           # two full blocks shared
    eng.submit([req_ids(0, head + [500, 501, 502])])
    drain(eng, 1)
    assert eng.stats().prefix_hit_tokens == 0
    eng.submit([req_ids(1, head + [600, 601])])
    drain(eng, 1)
    assert eng.stats().prefix_hit_tokens == 64
    eng.submit([req_ids(2, head)])  # a whole-prompt hit still computes its last token
    drain(eng, 1)
    assert eng.stats().prefix_hit_tokens == 64 + 63


def test_step_engine_spends_its_cpu_in_the_polling_thread():
    """The work is Python on the caller's thread (thread CPU time), not a sleep and not another
    thread."""
    c = contract(slots=2)
    eng = stepper(c, cpu_ms=20.0)
    eng.submit([req(0, n_in=10, n_out=4)])
    t0 = time.thread_time()
    drain(eng, 1)
    used = time.thread_time() - t0
    assert eng.stats().steps == 5 and used >= 5 * 0.020


def test_step_engine_cancel_and_errors_come_back_without_a_step():
    c = contract(slots=4, max_in=16)
    eng = stepper(c, cpu_ms=50.0)
    eng.submit([req(0, n_in=20), req(1, n_in=5, n_out=100)])
    eng.cancel("q1")
    results, _ = drain(eng, 2)
    assert {r.request_id: r.finish_reason for r in results} == {"q0": "error", "q1": "cancelled"}
    assert eng.stats().steps == 0


@pytest.mark.parametrize(
    "section, message",
    [
        (
            "{step_cpu_ms: 5, tokens_per_s_limit: 100}",
            "give tokens_per_s_limit or step_cpu_ms, not both",
        ),
        ("{step_cpu_ms: 0}", "greater than 0"),
        ("{step_cpu_ms: 5000}", "must be at most 1000.0, got 5000"),
        ("{step_ms: 5}", "step_ms"),
    ],
)
def test_instant_section_is_validated_at_load(tmp_path, section, message):
    (tmp_path / "i.yaml").write_text(_tiny_contract("spin", "instant", f"instant: {section}"))
    loaded = load_paths([tmp_path / "i.yaml"])
    lines = [p.render() for p in loaded.problems]
    assert not loaded.ok and any(
        "i.yaml::$.instant" in line and message in line for line in lines
    ), lines
