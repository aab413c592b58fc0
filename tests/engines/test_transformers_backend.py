"""The transformers backend on the real embedded tiny model (forge/embedded/tiny-llama), on CPU."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forge.config.models import Card, Contract
from forge.config.plan import plan_card
from forge.engines.interface import (
    REFUSED,
    EngineBusy,
    EngineFailed,
    EngineRequest,
    Guide,
    Sampling,
)
from forge.errors import ForgeError
from tests.installed import skip_module_unless_installed

pytestmark = pytest.mark.engine
skip_module_unless_installed("torch", "transformers")

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "forge" / "embedded" / "tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def contract(
    checkpoint: Path, *, random_weights: bool = False, sections: dict | None = None, **kv
) -> Contract:
    return Contract.model_validate(
        dict(
            contract="tiny-llama-cpu",
            backend="transformers",
            model=dict(
                architecture="LlamaForCausalLM",
                num_layers=4,
                num_kv_heads=4,
                head_dim=32,
                vocab_size=2048,
                weights_gib=0.011,
            ),
            artifact=dict(checkpoint=str(checkpoint), random_weights=random_weights),
            precision=dict(weights="fp32", kv_cache="fp32"),
            limits=dict(
                max_batch_size=32, max_num_tokens=512, max_input_len=384, max_output_len=128
            ),
            kv_cache=dict(
                dict(tokens_per_block=32, max_tokens=16384, host_cache_size=0, block_reuse=True),
                **kv,
            ),
            target=dict(kind="cpu"),
            sections=sections or {},
        )
    )


def plan_for(c: Contract):
    return plan_card(Card(index=0, kind="cpu", model="cpu", memory_gib=2, engine=c.contract), c)


def start(c: Contract):
    from forge.engines.transformers.backend import _factory

    return _factory(c, plan_for(c))


def run_all(engine, requests, timeout_s: float = 30.0):
    """Submit, then poll until every request has a result; returns (results by id, new_tokens
    seen)."""
    engine.submit(requests)
    got, tokens, deadline = {}, 0, time.monotonic() + timeout_s
    while len(got) < len(requests):
        assert time.monotonic() < deadline, (
            f"no result for {set(r.request_id for r in requests) - set(got)}"
        )
        progress = engine.poll(0.05)
        tokens += progress.new_tokens
        for r in progress.results:
            assert r.request_id not in got, "a request answered twice"
            got[r.request_id] = r
    return got, tokens


@pytest.fixture(scope="module")
def engine():
    eng = start(contract(TINY))
    yield eng
    eng.shutdown(10)


def req(engine, rid, text, max_new, **kw):
    return EngineRequest(rid, tuple(engine.tokenizer.encode(text)), max_new, **kw)


def test_generates_text_with_eos_and_length(engine):
    tok = engine.tokenizer
    assert tok.encode("Alice")[0] == 1 and tok.eos_token_id == 2          # BOS first, EOS is </s>
    requests = [
        req(engine, "a", "Alice was beginning to", 24),
        req(engine, "b", "The Mock Turtle said", 64),
        req(engine, "c", "`Off with her head!' the Queen", 64),
        req(engine, "d", "Down the Rabbit-Hole", 8),
        req(engine, "e", "The Mock Turtle said", 24, sampling=Sampling(stop_at_eos=False)),
    ]
    got, tokens = run_all(engine, requests)
    for r in requests:
        res = got[r.request_id]
        assert res.error is None and len(res.output_ids) <= r.max_new_tokens
        if res.finish_reason == "length":
            assert len(res.output_ids) == r.max_new_tokens
        else:
            assert res.finish_reason == "eos" and len(res.output_ids) < r.max_new_tokens
            assert tok.eos_token_id not in res.output_ids
    assert len(tok.decode(got["a"].output_ids).split()) >= 8                 # words, not byte soup
    assert got["b"].finish_reason == "eos"  # a paragraph end the model learned
    # EOS ignored when asked
    assert got["e"].finish_reason == "length" and len(got["e"].output_ids) == 24
    eos_count = sum(res.finish_reason == "eos" for res in got.values())
    assert tokens == sum(len(res.output_ids) for res in got.values()) + eos_count


def test_greedy_is_deterministic_and_sampling_per_request(engine):
    greedy = [req(engine, f"g{i}", "The Queen said", 16) for i in range(2)]
    sampled = [
        req(
            engine,
            f"s{i}",
            "The Queen said",
            16,
            sampling=Sampling(temperature=1.5, top_p=0.95, top_k=50),
        )
        for i in range(4)
    ]
    got, _ = run_all(engine, greedy + sampled)
    assert got["g0"].output_ids == got["g1"].output_ids
    # temperature 1.5 really samples
    assert len({tuple(got[f"s{i}"].output_ids) for i in range(4)}) > 1


def test_per_request_seeds(engine):
    """A sampled request with a seed draws its tokens from its own generator: the same seed gives
    the same tokens (alone or batched with unseeded sampled requests), another seed other tokens.
    Before forge's seeded sampler the engine refused sampled requests with a seed."""
    def seeded(rid, seed, temperature=1.5):
        return req(
            engine,
            rid,
            "The Queen said",
            24,
            sampling=Sampling(temperature=temperature, top_p=0.95, seed=seed),
        )

    alone, _ = run_all(engine, [seeded("a", 7)])
    noise = [
        req(engine, f"n{i}", "The Queen said", 24, sampling=Sampling(temperature=1.5))
        for i in range(3)
    ]
    batch, _ = run_all(engine, [seeded("b", 7), seeded("c", 8), seeded("d", 9), *noise])
    assert alone["a"].error is None and alone["a"].output_ids == batch["b"].output_ids
    assert len({tuple(batch[k].output_ids) for k in "bcd"}) == 3
    assert not engine._seeds._seeds and not engine._seeds._generators        # forgotten when done


def test_refuses_what_it_cannot_honour(engine):
    ok = tuple(engine.tokenizer.encode("Alice"))
    bad = [
        EngineRequest("long", (1,) * 385, 4),
        EngineRequest("out", ok, 129),
        EngineRequest("vocab", (1, 5000), 4),
        EngineRequest("empty", (), 4),
        EngineRequest("guide", ok, 4, guide=Guide(regex="yes|no")),
    ]
    got, _ = run_all(
        engine, bad + [EngineRequest("fine", ok, 4, sampling=Sampling(temperature=0, seed=3))]
    )
    for r in bad:
        assert got[r.request_id].finish_reason == REFUSED and got[r.request_id].error
    assert "max_input_len" in got["long"].error
    assert got["fine"].finish_reason in ("eos", "length") and got["fine"].error is None
    with pytest.raises(ValueError):
        engine.submit([EngineRequest("dup", ok, 2), EngineRequest("dup", ok, 2)])


def test_hidden_state(engine):
    got, _ = run_all(engine, [req(engine, "h0", "Alice", 0, want_hidden=True),
                              req(engine, "h1", "Alice was beginning to", 6, want_hidden=True)])
    for rid in ("h0", "h1"):
        h = got[rid].hidden
        assert isinstance(h, list) and len(h) == 256 and all(isinstance(x, float) for x in h)
        assert any(x != 0.0 for x in h)
    assert got["h0"].output_ids == [] and got["h0"].finish_reason == "length"
    assert len(got["h1"].output_ids) > 0


def test_cancel_and_busy_and_stats(engine):
    prompt = tuple(engine.tokenizer.encode("Alice was beginning to get very tired"))
    engine.submit([EngineRequest("long", prompt, 128, sampling=Sampling(stop_at_eos=False))])
    deadline = time.monotonic() + 10
    seen = 0
    while seen < 4:
        assert time.monotonic() < deadline
        progress = engine.poll(0.02)
        assert not progress.results
        seen += progress.new_tokens
    st = engine.stats()
    assert (
        st.active + st.queued == 1
        and st.kv_blocks_used >= 1
        and st.kv_blocks_used + st.kv_blocks_free == 512
    )
    assert st.steps >= 4
    engine.cancel("long")
    engine.cancel("long")                                        # twice is harmless
    res = engine.poll(1.0).results
    assert [(r.request_id, r.finish_reason) for r in res] == [("long", "cancelled")]
    assert 4 <= len(res[0].output_ids) < 128
    # capacity: 32 slots + 32 waiting, all or nothing
    many = [EngineRequest(f"m{i}", prompt, 128) for i in range(64)]
    engine.submit(many)
    with pytest.raises(EngineBusy):
        engine.submit([EngineRequest("one-too-many", prompt, 4)])
    for r in many:
        engine.cancel(r.request_id)
    cancelled = engine.poll(1.0).results
    assert len(cancelled) == 64 and {r.finish_reason for r in cancelled} == {"cancelled"}
    deadline = time.monotonic() + 5
    while engine.stats().active or engine.stats().queued:  # the manager lets them go within a step
        assert time.monotonic() < deadline
        assert not engine.poll(0.05).results   # cancelled requests never answer again
    assert engine.stats().kv_blocks_used <= 8  # only blocks kept for prefix reuse, if any


def test_prefix_reuse_is_counted(engine):
    before = engine.stats().prefix_hit_tokens
    shared = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing " \
             "to do: once or twice she had peeped into the book her sister was reading"
    run_all(engine, [req(engine, "p0", shared, 2)])
    run_all(engine, [req(engine, "p1", shared + " again", 2)])
    # at least one 32-token block came from reuse
    assert engine.stats().prefix_hit_tokens - before >= 32


def test_describe_has_the_exact_config(engine):
    d = engine.describe()
    cb = d["continuous_batching_config"]
    assert (
        cb["max_batch_tokens"],
        cb["max_requests_per_batch"],
        cb["page_size"],
        cb["num_blocks"],
    ) == (512, 32, 32, 512)
    assert (
        cb["allow_block_sharing"] is True
        and cb["cpu_offload_space"] == 0.0
        and cb["scheduler_type"] == "fifo"
    )
    assert d["resolved"]["num_blocks"] == 512 and d["resolved"]["max_batch_tokens"] == 512
    # the padding a graph or compiled tier would use, as transformers resolved it (its presets: 64
    # and 16,384)
    assert (
        d["resolved"]["q_padding_interval_size"],
        d["resolved"]["kv_padding_interval_size"],
    ) == (64, 16384)
    assert d["weights"] == "checkpoint" and d["dtype"] == "float32" and d["device"] == "cpu"
    json.dumps(d)  # plain data, for logs and `forge status`


def test_loop_death_is_engine_failed():
    eng = start(contract(TINY))
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("injected device fault")

        # fault injection into the real loop
        eng._manager.batch_processor.model_runner.compute_batch = broken
        eng.submit([req(eng, "x", "Alice", 4)])
        deadline = time.monotonic() + 10
        with pytest.raises(EngineFailed, match="injected device fault"):
            while time.monotonic() < deadline:
                # victims of the dead loop are not reported as answers
                assert not eng.poll(0.05).results
        with pytest.raises(EngineFailed):
            eng.submit([req(eng, "y", "Alice", 4)])
    finally:
        eng.shutdown(5)


def test_shutdown_is_fast_and_final():
    eng = start(contract(TINY))
    eng.submit([req(eng, "z", "Alice", 128, sampling=Sampling(stop_at_eos=False))])
    eng.poll(0.05)
    t0 = time.monotonic()
    eng.shutdown(5)
    assert time.monotonic() - t0 < 3
    assert not eng._manager.is_running()
    with pytest.raises(EngineFailed):
        eng.poll(0.01)
    with pytest.raises(EngineFailed):
        eng.submit([req(eng, "w", "Alice", 4)])
    eng.shutdown(5)                                                # idempotent


def config_only_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for name in ("config.json",) + TOKENIZER_FILES:
        shutil.copy(TINY / name, d / name)
    return d


def test_missing_weights_is_an_error_naming_the_path(tmp_path):
    d = config_only_dir(tmp_path)
    with pytest.raises(ForgeError, match=f"{d.name}.*no model weights.*random_weights"):
        start(contract(d))


def test_random_weights_from_config_alone(tmp_path):
    eng = start(contract(config_only_dir(tmp_path), random_weights=True))
    try:
        assert eng.describe()["weights"] == "random"
        got, _ = run_all(eng, [req(eng, "r", "Alice", 5, sampling=Sampling(stop_at_eos=False))])
        assert len(got["r"].output_ids) == 5
    finally:
        eng.shutdown(5)


def test_bad_section_and_precision_are_refused():
    with pytest.raises(ForgeError, match=r"\$\.transformers"):
        start(contract(TINY, sections={"transformers": {"dtype": "float64"}}))
    with pytest.raises(ForgeError, match="kv_cache"):
        start(contract(TINY, sections={"transformers": {"dtype": "bfloat16"}}))


def test_a_card_plan_of_several_replicas_is_refused_one_replica_plan_loads():
    """Until the runtime starts one engine worker per replica, handing the factory the card's plan
    would start one engine where the node declares two: refused before any load. A replica's own
    plan builds its engine."""
    from forge.config.plan import replica_plans
    from forge.engines.transformers.backend import _factory

    c = contract(TINY)
    card_plan = plan_card(
        Card(index=0, kind="cpu", model="cpu", memory_gib=2, engine=c.contract, replicas=2), c
    )
    with pytest.raises(ForgeError, match="declares replicas: 2.*not one replica's"):
        _factory(c, card_plan)
    eng = _factory(c, replica_plans(card_plan)[1])
    try:
        assert eng.describe()["card"] == "cpu0"
    finally:
        eng.shutdown(5)


def test_backend_module_imports_without_torch():
    code = ("import sys; import forge.engines.transformers.backend as m; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
            "print(m.BACKEND)")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "transformers", out.stderr


def test_registered_as_one_backend_object():
    from forge.backends import get
    from forge.engines.transformers.backend import TransformersSection, _factory

    b = get("transformers")
    assert (b.name, b.section, b.factory) == ("transformers", TransformersSection, _factory)


# ---------------------------------------------------------------- the pure mappings (no engine)
def test_cb_config_from_a_gpu_fraction_contract():
    from forge.engines.transformers.sizing import cb_config_kwargs
    from forge.engines.transformers.backend import TransformersSection

    c = Contract.model_validate(
        dict(
            contract="gpu-tier",
            backend="transformers",
            model=dict(
                architecture="LlamaForCausalLM",
                num_layers=32,
                num_kv_heads=8,
                head_dim=128,
                vocab_size=32000,
                weights_gib=15.0,
            ),
            artifact=dict(checkpoint="ckpt", random_weights=True),
            precision=dict(weights="bf16", kv_cache="bf16"),
            limits=dict(
                max_batch_size=256, max_num_tokens=8192, max_input_len=1024, max_output_len=128
            ),
            kv_cache=dict(
                tokens_per_block=256,
                free_gpu_memory_fraction=0.8,
                host_cache_size="8GiB",
                block_reuse=False,
            ),
            target=dict(kind="gpu", compute_capability="9.0"),
        )
    )
    plan = plan_card(
        Card(
            index=1,
            kind="gpu",
            model="NVIDIA H200",
            memory_gib=139.8,
            compute_capability="9.0",
            engine="gpu-tier",
        ),
        c,
    )
    kw = cb_config_kwargs(
        plan, TransformersSection(attn_implementation="flash_attention_2", use_cuda_graph=True)
    )
    assert kw["num_blocks"] == plan.num_blocks > 0 and kw["max_memory_percent"] == 0.8
    assert (kw["max_batch_tokens"], kw["max_requests_per_batch"], kw["page_size"]) == (
        8192,
        256,
        256,
    )
    assert (
        kw["cpu_offload_space"] == 8.0
        and kw["allow_block_sharing"] is False
        and kw["use_cuda_graph"] is True
    )
    assert kw["max_blocks_per_request"] == plan.blocks_per_full_seq == 5
    assert kw["max_queue_size"] == 512 and kw["auto_switch_to_flash"] is False
    # query padding for CUDA graphs: transformers 5.24's preset, stated, or the contract's
    assert kw["q_padding_interval_size"] == 64
    assert cb_config_kwargs(plan, TransformersSection(use_cuda_graph=True, graph_q_padding=128))[
        "q_padding_interval_size"] == 128


def test_sampling_modes():
    from forge.engines.transformers import requests as reqs

    limits = dict(max_input_len=8, max_output_len=8, vocab_size=100)
    hot = EngineRequest("t", (1, 2), 4, sampling=Sampling(temperature=0.9))
    assert "greedily" in reqs.refusal(hot, sampling_mode="greedy", **limits)
    assert reqs.refusal(hot, sampling_mode="per_request", **limits) is None
    top1 = EngineRequest("k", (1, 2), 4, sampling=Sampling(temperature=0.9, top_k=1, seed=5))
    assert reqs.refusal(top1, sampling_mode="greedy", **limits) is None          # top_k=1 is greedy
    assert reqs.processor_kwargs(Sampling(), sampling_mode="per_request", vocab_size=100) == \
        {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    assert reqs.processor_kwargs(Sampling(temperature=0.7, top_p=0.9), sampling_mode="per_request",
                                 vocab_size=100) == {"temperature": 0.7, "top_k": 100, "top_p": 0.9}
    assert reqs.processor_kwargs(hot.sampling, sampling_mode="greedy", vocab_size=100) == {}


def test_the_loop_hands_over_one_output_per_request_not_one_per_step(engine):
    """Requests run without streaming, as transformers' own API runs them: the generation loop
    builds and queues one output per request when it ends (streaming cost one per running request
    per step, under the loop's GIL), and the token progress still adds up exactly."""
    manager, taken = engine._manager, []
    real = manager.get_result

    def counted(*a, **kw):
        out = real(*a, **kw)
        if out is not None:
            taken.append(out.request_id)
        return out

    manager.get_result = counted
    try:
        got, tokens = run_all(engine, [req(engine, f"o{i}", "The Queen of Hearts", 20,
                                           sampling=Sampling(stop_at_eos=False)) for i in range(3)])
    finally:
        del manager.get_result
    assert all(len(r.output_ids) == 20 for r in got.values())
    assert len(taken) == 3 and tokens == 60


def test_the_load_time_warm_up_runs_a_full_budget_step_and_a_full_slot_decode_and_leaves_the_engine_as_it_was(engine):
    """forge/engines/transformers/warm.py, run at load on CUDA cards, here through the tiny engine's
    own started manager: both rounds finish within their bound, and the engine's requests before and
    after are untouched by them."""
    from forge.engines.transformers.warm import warm_up

    lim = engine.plan.contract.limits
    steps = engine.stats().steps
    why = warm_up(engine._manager, budget=lim.max_num_tokens, max_input_len=lim.max_input_len,
                  slots=lim.max_batch_size, vocab_size=2048, request_kwargs={}, timeout_s=60)
    assert why is None and engine.stats().steps >= steps + 2
    got, tokens = run_all(
        engine,
        [req(engine, "after", "The Queen of Hearts", 8, sampling=Sampling(stop_at_eos=False))],
    )
    assert list(got) == ["after"] and len(got["after"].output_ids) == 8 and tokens == 8
    assert (
        warm_up(
            engine._manager,
            budget=lim.max_num_tokens,
            max_input_len=lim.max_input_len,
            slots=lim.max_batch_size,
            # bounded: says when cut short
            vocab_size=2048,
            request_kwargs={},
            timeout_s=0.0,
        )
        is not None
    )


def test_the_attention_mask_rule_counts_the_mask_the_engine_allocates(engine):
    """attention_masks_fit (forge/engines/transformers/attention_memory.py) refuses tiers whose mask
    does not fit the card; its arithmetic is the size of the mask tensors transformers actually
    allocates for the tier."""
    from forge.engines.transformers.attention_memory import mask_bytes
    from forge.engines.transformers.sizing import section_of

    masks = engine._manager.batch_processor.inputs_and_outputs.attention_mask
    allocated = sum(t.numel() * t.element_size() for t in masks.values())
    plan = plan_for(contract(TINY))
    assert allocated == mask_bytes(plan, section_of(plan)) == 512 * (16384 + 512) * 4
