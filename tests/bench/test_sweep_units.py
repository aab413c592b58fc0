"""The sweep's candidate space, its contract rules and its tier files (no engine): what is tried,
what is skipped and why, how winners combine, and that a written tier is a file `forge validate`
accepts."""
from __future__ import annotations

from pathlib import Path

import pytest

from forge.config.load import load_node, load_paths
from forge.config.registry import from_plugins
from forge.errors import UsageError
from forge_bench import candidates as cm
from forge_bench.candidates import Candidate, apply, dimensions, single_changes, winners
from forge_bench.tierfile import load_tier, write_contract, write_tier
from tests.forge_cli import invoke

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "docs" / "bench" / "h200"


@pytest.fixture(scope="module")
def cpu_plan():
    return load_node(ROOT / "node_descriptions" / "local.yaml").plans[0]


@pytest.fixture(scope="module")
def gpu_loaded():
    return load_node(H200 / "node-llama-1p5b.yaml")


def by_key(cands):
    return {c.key: c for c in cands}


def test_transformers_declares_its_switches_through_its_backend_object(gpu_loaded):
    from forge.backends import registered

    assert sorted(name for name, b in registered().items() if b.tunables is not None) == [
        "transformers",
        "vllm",
    ]
    plan = gpu_loaded.plans[0]
    dims = dimensions(plan, mode="forge", overrides={}, skip=())
    assert [d.field for d in dims] == [
        "transformers.use_cuda_graph",
        "transformers.attn_implementation",
        "transformers.scheduler",
        "transformers.async_batching",
        "transformers.graph_q_padding",
        cm.TOKENS,
        cm.SLOTS,
        cm.REPLICAS,
        "transformers.compile_level",
    ]  # slow last
    attn = {c.value: c.unavailable for c in dims[1].choices}
    assert attn["sdpa"] is None and attn["eager"] is None
    assert "flash-attn package" in attn["flash_attention_2"]  # not installed on this machine
    assert "refuses it" in attn["flex_attention"] and "alias" in attn["paged|sdpa"]
    assert [c.value for c in dims[5].choices] == [4096, 16384] and [
        c.value for c in dims[6].choices
    ] == [64, 256]


def test_one_change_at_a_time_with_reasons_for_what_cannot_run(cpu_plan, gpu_loaded):
    sections = from_plugins().sections
    dims = dimensions(cpu_plan, mode="forge", overrides={}, skip=())
    cands = by_key(single_changes(cpu_plan, dims, [], sections))
    assert "transformers.scheduler=fifo" not in cands  # the shipped value is the base
    assert cands["transformers.use_cuda_graph=true"].reason == "needs a GPU card"
    assert cands["transformers.async_batching=true"].status == "skipped"
    assert cands["card.replicas=2"].status == "pending"  # the node runs one worker per replica
    assert cands["transformers.scheduler=prefill_first"].status == "pending"
    assert [k for k in cands if k.startswith("limits.max_num_tokens")] == [
        "limits.max_num_tokens=256",
        "limits.max_num_tokens=1024",
    ]
    direct = by_key(
        single_changes(
            cpu_plan, dimensions(cpu_plan, mode="direct", overrides={}, skip=()), [], sections
        )
    )
    assert "the direct engine is one engine" in direct["card.replicas=2"].reason
    gpu = gpu_loaded.plans[0]
    on = by_key(
        single_changes(gpu, dimensions(gpu, mode="forge", overrides={}, skip=()), [], sections)
    )
    assert (
        on["card.replicas=2"].status == "pending"
        and on["transformers.use_cuda_graph=true"].status == "pending"
    )


def test_overrides_skips_and_tries(cpu_plan):
    sections = from_plugins().sections
    dims = dimensions(cpu_plan, mode="forge", overrides=cm.parse_sets(
        ["transformers.compile_level=1", "limits.max_num_tokens=768,2048"], "--set"),
        skip=("transformers.attn_implementation", cm.SLOTS))
    assert {d.field for d in dims} >= {cm.TOKENS} and "transformers.attn_implementation" not in {
        d.field for d in dims
    }
    tries = cm.parse_try(["transformers.scheduler=prefill_first,limits.max_num_tokens=768",
                          "transformers.use_cuda_graph=true,limits.max_num_tokens=768"])
    cands = single_changes(cpu_plan, dims, tries, sections)
    keys = [c.key for c in cands]
    assert "transformers.compile_level=1" in keys and "limits.max_num_tokens=2048" in keys
    combo = by_key(cands)["transformers.scheduler=prefill_first + limits.max_num_tokens=768"]
    assert combo.stage == "try" and combo.status == "pending"
    gpu_only = by_key(cands)["transformers.use_cuda_graph=true + limits.max_num_tokens=768"]
    assert gpu_only.status == "skipped" and "needs a GPU card" in gpu_only.reason
    assert cm.parse_value("paged|sdpa") == "paged|sdpa" and cm.parse_value("true") is True
    for bad in (["x=1"], ["transformers.scheduler"], ["limits.max_num_tokens="]):
        with pytest.raises(UsageError):
            cm.parse_sets(bad, "--set")
    with pytest.raises(UsageError, match="no sweep dimension 'transformers.turbo'"):
        dimensions(cpu_plan, mode="forge", overrides={"transformers.turbo": [1]}, skip=())


def test_winners_are_the_best_value_per_dimension_beyond_the_gain():
    def ran(changes, tps):
        c = Candidate(cm.key_of(changes), changes, "one", status="ran")
        c.result = {"completed": 4, "requests": 4, "tokens_per_s": tps}
        return c

    cands = [
        ran({"a.x": 1}, 103.0),
        ran({"a.x": 2}, 120.0),
        ran({"a.y": True}, 110.0),
        ran({"a.z": 3}, 102.0),
    ]
    cands.append(Candidate("a.w=1", {"a.w": 1}, "one", status="failed"))
    got = winners(cands, base_tps=100.0, min_gain=0.03)
    # a.z: +2 % is inside min_gain; a.x's best value
    assert [c.key for c in got] == ["a.x=2", "a.y=true"]
    assert cm.best_of(cands).key == "a.x=2"


def test_a_candidate_that_breaks_a_rule_is_refused_by_the_validator(tmp_path, cpu_plan):
    sections = from_plugins().sections
    loaded = load_node(ROOT / "node_descriptions" / "local.yaml")
    contract, card, why = apply(cpu_plan, {cm.TOKENS: 256}, sections)
    assert why is None
    write_tier(loaded, contract, card, tmp_path / "t")
    got, why = load_tier(tmp_path / "t" / "node.yaml")
    assert got is None and "max_num_tokens 256 is below max_input_len 384" in why
    _, _, why = apply(cpu_plan, {"transformers.attn_implementation": "flex_attention"}, sections)
    assert why.startswith("$.transformers.attn_implementation:")
    # The GPU-only rule is the validator's (forge_validation_rules), so `forge validate` refuses it
    # too.
    contract, card, _ = apply(cpu_plan, {"transformers.use_cuda_graph": True}, sections)
    write_tier(loaded, contract, card, tmp_path / "g")
    got, why = load_tier(tmp_path / "g" / "node.yaml")
    assert got is None and "$.transformers.use_cuda_graph: CUDA graphs need a GPU" in why


def test_graph_q_padding_is_a_switch_of_padded_tiers_and_refused_where_it_pads_nothing(
    tmp_path, gpu_loaded
):
    sections = from_plugins().sections
    eager = gpu_loaded.plans[0]  # the shipped 1.5B tier: no CUDA graphs, no compile
    fast_loaded = load_node(H200 / "node-llama-8b-fast.yaml")   # CUDA graphs, token budget 2,048
    fast = fast_loaded.plans[0]

    def padding_choices(plan):
        dims = {d.field: d for d in dimensions(plan, mode="forge", overrides={}, skip=())}
        return {c.value: c.unavailable for c in dims["transformers.graph_q_padding"].choices}

    assert padding_choices(fast) == {64: None, 128: None, 256: None}
    eager_choices = padding_choices(eager)
    assert (
        eager_choices[64] is None
        and "pads only with use_cuda_graph or compile_level" in eager_choices[128]
    )
    # the rule is the validator's, so a written tier (and `forge validate`) refuses the same
    contract, card, _ = apply(eager, {"transformers.graph_q_padding": 128}, sections)
    write_tier(gpu_loaded, contract, card, tmp_path / "eager")
    got, why = load_tier(tmp_path / "eager" / "node.yaml")
    assert got is None and "$.transformers.graph_q_padding: 128 has no effect" in why
    contract, card, _ = apply(fast, {"transformers.graph_q_padding": 4096}, sections)
    write_tier(fast_loaded, contract, card, tmp_path / "wide")
    got, why = load_tier(tmp_path / "wide" / "node.yaml")
    assert got is None and "4096 is more than limits.max_num_tokens (2048)" in why
    contract, card, _ = apply(fast, {"transformers.graph_q_padding": 128}, sections)
    write_tier(fast_loaded, contract, card, tmp_path / "ok")
    got, why = load_tier(tmp_path / "ok" / "node.yaml")
    assert (
        why is None
        and got.contracts[got.plans[0].contract.contract].sections["transformers"].graph_q_padding
        == 128
    )


def test_replicas_candidate_is_a_card_field_checked_against_memory_and_cores(tmp_path, gpu_loaded):
    sections = from_plugins().sections
    plan = gpu_loaded.plans[0]
    contract, card, _ = apply(plan, {cm.REPLICAS: 2, "transformers.use_cuda_graph": True}, sections)
    write_tier(gpu_loaded, contract, card, tmp_path / "r2")
    got, why = load_tier(tmp_path / "r2" / "node.yaml")
    assert (
        why is None
        and got.plans[0].replicas == 2
        and got.plans[0].card_bytes < got.plans[0].card_memory_bytes
    )
    # 9 engine processes on 8 host cores
    contract, card, _ = apply(plan, {cm.REPLICAS: 9}, sections)
    write_tier(gpu_loaded, contract, card, tmp_path / "r9")
    assert (
        "$.host.cpu_cores: the cards run 9 engine processes"
        in load_tier(tmp_path / "r9" / "node.yaml")[1]
    )


def test_a_written_contract_validates_anywhere_its_paths_rebased(tmp_path, gpu_loaded):
    sections = from_plugins().sections
    contract, _, _ = apply(
        gpu_loaded.plans[0], {"transformers.use_cuda_graph": True, cm.SLOTS: 256}, sections
    )
    path = write_contract(contract, tmp_path / "deep" / "down" / "best.yaml", ["written by a test"])
    text = path.read_text()
    assert (
        text.startswith("# written by a test\n")
        and "use_cuda_graph: true" in text
        and "sampling: greedy" in text
    )
    assert "max_batch_size: 256" in text and "free_gpu_memory_fraction" not in text
    got = load_paths([path])
    assert got.ok, [p.render() for p in got.problems]
    out = invoke("validate", path)
    assert out.returncode == 0, out.stdout + out.stderr
    c = got.contracts["h200-llama-1p5b"]
    assert c.resolve(c.artifact.checkpoint) == (H200 / "llama-1p5b").resolve()


def test_the_winner_is_what_the_confirm_backs():
    from forge_bench.winner import pick_winner

    def ran(key, tps):
        c = Candidate(
            key,
            {} if key == "base" else {"a.x": key},
            "base" if key == "base" else "one",
            status="ran",
        )
        c.result = {"completed": 4, "requests": 4, "tokens_per_s": tps}
        return c

    base, fast = ran("base", 100.0), ran("fast", 150.0)
    assert pick_winner([base, fast], {"status": "ran", "ratio_mean": 1.2, "repeat": 2})[0] is fast
    cand, why = pick_winner([base, fast], {"status": "ran", "ratio_mean": 0.98, "repeat": 2})
    assert cand is base and "the shipped tier stays" in why
    cand, why = pick_winner([base, fast], {"status": "cut", "reason": "no time left"})
    assert cand is fast and why.startswith("NOT confirmed (cut: no time left)")
    assert (
        pick_winner([ran("base", 200.0), fast], {"status": "skipped"})[1]
        == "the shipped tier was the fastest candidate"
    )
    assert pick_winner([Candidate("base", {}, "base", status="cut")], {})[0] is None


def test_a_candidate_starts_only_with_time_for_it_and_the_confirm(cpu_plan, tmp_path, monkeypatch):
    from forge_bench.sweep import Sweep, SweepOptions

    loaded = load_node(ROOT / "node_descriptions" / "local.yaml")
    sweep = Sweep(
        loaded,
        "tiny-llama-cpu",
        SweepOptions(
            workload=ROOT / "bench/forge_bench/quick.yaml",
            deadline_s=200,
            candidate_limit_s=30,
            confirm_repeat=2,
        ),
        tmp_path,
    )
    base, other = (
        sweep.candidates[0],
        next(c for c in sweep.candidates if c.status == "pending" and c.stage == "one"),
    )
    base.status, base.wall_s = "ran", 20.0
    base.result = {"completed": 4, "requests": 4, "tokens_per_s": 100.0, "window_s": 10.0}
    clock = [sweep.t0]
    monkeypatch.setattr("forge_bench.sweep.time.monotonic", lambda: clock[0])
    assert sweep._limit(other) == 30.0  # 200 s left, nothing to confirm yet: the candidate limit
    clock[0] = sweep.t0 + 175           # 25 s left >= the typical wall (the shipped tier's 20 s)
    assert sweep._limit(other) == 25.0
    other.status, other.wall_s = "ran", 12.0
    other.result = {"completed": 4, "requests": 4, "tokens_per_s": 150.0, "window_s": 4.0}
    nxt = next(c for c in sweep.candidates if c.status == "pending" and c.stage == "one")
    # a winner exists: the confirm loads both tiers once per repeat and runs their windows, 2 x (20
    # + 12) x 1.1 + 5
    clock[0] = sweep.t0 + 100  # 100 s left - 75.4 kept = 24.6 s >= the median wall, 20 s
    assert sweep._limit(nxt) == pytest.approx(24.6)
    assert sweep._reserve == pytest.approx(75.4)
    clock[0] = sweep.t0 + 110  # 14.6 s: less than a typical candidate takes
    assert sweep._limit(nxt) is None


def test_the_confirm_reserve_scales_only_the_window_to_the_confirm_records():
    from forge_bench.sweep import confirm_reserve, typical_wall

    base = Candidate("base", {}, "base", status="ran", wall_s=40.0, result={"window_s": 14.5})
    best = Candidate("g", {"x": 1}, "one", status="ran", wall_s=24.8, result={"window_s": 5.9})
    # 2 repeats x ((25.5 + 29.0) + (18.9 + 11.8)) x 1.1 + 5: loads once per repeat, windows at twice
    # the records
    assert confirm_reserve(base, best, 2, 2.0) == pytest.approx(
        2 * (25.5 + 29.0 + 18.9 + 11.8) * 1.1 + 5
    )
    # never below the run
    assert confirm_reserve(base, best, 1, 0.5) == pytest.approx((40.0 + 24.8) * 1.1 + 5)
    cut = Candidate("c", {"x": 2}, "one", status="cut", wall_s=99.0)
    assert typical_wall([base, best, cut]) == 40.0 and typical_wall([cut]) == 0.0
    assert typical_wall([base, best, Candidate("d", {}, "one", status="ran", wall_s=30.0)]) == 30.0


def test_a_written_winner_sits_beside_the_shipped_tiers(tmp_path, gpu_loaded):
    """What the sweep stage writes into docs/bench/h200/: a new contract name and a node named after
    its file, so `forge validate docs/bench/h200/` holds both tiers without a name clash."""
    from forge_bench.tierfile import write_node

    folder = tmp_path / "h200"
    sections = from_plugins().sections
    contract, card, _ = apply(gpu_loaded.plans[0], {"transformers.use_cuda_graph": True}, sections)
    contract = contract.model_copy(update={"contract": "h200-llama-1p5b-winner"})
    cpath = write_contract(contract, folder / "h200-llama-1p5b-winner.yaml")
    npath = write_node(
        gpu_loaded,
        card.model_copy(update={"engine": "h200-llama-1p5b-winner"}),
        cpath,
        folder / "node-llama-1p5b-winner.yaml",
    )
    assert (
        "- h200-llama-1p5b-winner.yaml" in npath.read_text()
        and "node: node-llama-1p5b-winner" in npath.read_text()
    )
    got = load_paths([H200, cpath, npath])
    assert got.ok, [p.render() for p in got.errors]
    assert got.nodes["node-llama-1p5b-winner"].cards[0].engine == "h200-llama-1p5b-winner"
