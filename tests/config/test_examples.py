"""The shipped examples validate, and their plans hold the numbers the docs state."""
from __future__ import annotations

import json

import pytest

from forge.config.load import load_node, load_paths
from tests.config.conftest import REPO


def test_all_examples_validate_without_warnings():
    loaded = load_paths([REPO / "node_descriptions", REPO / "engine_contracts"])
    assert loaded.problems == [], "\n".join(p.render() for p in loaded.problems)
    assert sorted(loaded.nodes) == ["fabric-a", "fabric-long", "local", "local-mixed", "local-vllm"]
    assert sorted(loaded.contracts) == [
        "llama7b-fp8-1k",
        "llama7b-fp8-1k-engine",
        "llama7b-fp8-1k-half",
        "llama7b-fp8-long",
        "tiny-llama-cpu",
        "tiny-llama-vllm",
    ]


@pytest.mark.parametrize("name, rows", [
    ("fabric-a", [("gpu0", "llama7b-fp8-1k", 10792, 299, 8192, 256),
                  ("gpu1", "llama7b-fp8-1k-half", 3829, 106, 4096, 96)]),
    ("fabric-long", [("gpu0", "llama7b-fp8-long", 2698, 87, 8192, 64),
                     ("gpu1", "llama7b-fp8-1k-half", 3829, 106, 4096, 96)]),
    ("local", [("cpu0", "tiny-llama-cpu", 512, 32, 512, 32)]),
    ("local-vllm", [("cpu0", "tiny-llama-vllm", 512, 32, 512, 32)]),
])
def test_example_plans(name, rows):
    loaded = load_node(REPO / "node_descriptions" / f"{name}.yaml")
    assert loaded.warnings == []
    got = [
        (p.card_id, p.contract.contract, p.num_blocks, p.full_length_slots, p.token_budget, p.slots)
        for p in loaded.plans
    ]
    assert got == rows
    for p in loaded.plans:
        # every slot can hold a full sequence
        assert p.fits_memory and p.full_length_slots >= p.slots


def test_embedded_default_has_the_fixed_geometry():
    loaded = load_node(REPO / "node_descriptions" / "local.yaml")
    c = loaded.contracts["tiny-llama-cpu"]
    assert (c.backend, c.precision.weights, c.precision.kv_cache) == (
        "transformers",
        "fp32",
        "fp32",
    )
    assert c.limits.model_dump() == {
        "max_batch_size": 32,
        "max_num_tokens": 512,
        "max_input_len": 384,
        "max_output_len": 128,
    }
    assert (c.kv_cache.tokens_per_block, c.kv_cache.max_tokens, c.kv_cache.host_cache_bytes,
            c.kv_cache.block_reuse) == (32, 16384, 0, True)
    assert (
        c.resolve(c.artifact.checkpoint) == (REPO / "forge" / "embedded" / "tiny-llama").resolve()
    )
    card = loaded.node.cards[0]
    assert (card.index, card.kind, card.model, card.memory_gib, card.engine) == (
        0,
        "cpu",
        "cpu",
        2,
        "tiny-llama-cpu",
    )
    assert (loaded.node.host.memory_gib, loaded.node.host.cpu_cores, loaded.node.metrics.port) == (
        4,
        2,
        0,
    )


@pytest.mark.parametrize("engine", ["llama7b-fp8-1k", "llama7b-fp8-1k-half", "llama7b-fp8-long"])
def test_fixture_engine_dirs_have_the_real_layout(engine):
    d = REPO / "engines" / engine
    cfg = json.loads((d / "config.json").read_text())
    assert list(cfg) == ["version", "pretrained_config", "build_config"]
    assert {"mapping", "quantization"} <= set(cfg["pretrained_config"])
    assert "plugin_config" in cfg["build_config"]
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "rank0.engine"]
    assert (d / "rank0.engine").read_text().startswith("PLACEHOLDER")     # stated, not pretended


def test_fixture_checkpoint_states_its_placeholder_and_its_kv_quantization():
    d = REPO / "engines" / "llama7b-fp8-checkpoint"
    assert sorted(p.name for p in d.iterdir()) == [
        "config.json",
        "hf_quant_config.json",
        "model.safetensors",
    ]
    assert (d / "model.safetensors").read_text().startswith("PLACEHOLDER")  # stated, not pretended
    quant = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == ("FP8", "FP8")
    loaded = load_paths([REPO / "node_descriptions", REPO / "engine_contracts"])
    # the shipped tiers: checkpoints
    for name in ("llama7b-fp8-1k", "llama7b-fp8-1k-half", "llama7b-fp8-long"):
        c = loaded.contracts[name]
        assert c.resolve(c.artifact.checkpoint) == d.resolve() and "trtllm" in c.sections
    legacy = loaded.contracts["llama7b-fp8-1k-engine"]  # the legacy example
    assert legacy.artifact.engine_dir is not None and not any(
        card.engine == legacy.contract for node in loaded.nodes.values() for card in node.cards)


def test_validation_needs_no_engine_library():
    import os
    import subprocess
    import sys

    code = ("import sys; from forge.config.load import load_paths; "
            "ok = load_paths(['node_descriptions', 'engine_contracts']).ok; "
            "heavy = [m for m in ('torch', 'transformers', 'tensorrt_llm') if m in sys.modules]; "
            "print(ok, heavy)")
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FORGE_LOAD_PLUGINS": ""},
    )
    assert out.stdout.strip() == "True []", out.stderr


@pytest.mark.parametrize(
    "name, contract", [("local", "tiny-llama-cpu"), ("local-vllm", "tiny-llama-vllm")]
)
def test_packaged_nodes_are_the_repo_nodes(name, contract):
    """forge/embedded/NAME.yaml (shipped in the package, `--node NAME`) and
    node_descriptions/NAME.yaml describe the same node with the same packaged contract; only the
    path to that contract differs."""
    import yaml

    from forge.embedded import PACKAGED_NODES

    packaged, repo = (
        yaml.safe_load(p.read_text())
        for p in (PACKAGED_NODES[name], REPO / f"node_descriptions/{name}.yaml")
    )
    assert {k: v for k, v in packaged.items() if k != "contracts"} == {
        k: v for k, v in repo.items() if k != "contracts"
    }
    a, b = load_node(PACKAGED_NODES[name]), load_node(REPO / f"node_descriptions/{name}.yaml")
    assert a.contracts[contract].source.resolve() == b.contracts[contract].source.resolve()


def test_the_vllm_against_transformers_bench_pair_differs_only_in_engine():
    """docs/bench/cpu-vllm holds the two nodes of docs/benchmarks.md's "vLLM ÷ transformers" figure:
    the same cards, and contracts that differ from each other only where the backend does (its name,
    `backend`, the `vllm:` section), and from the embedded contracts only in precision and the
    weights' size."""
    loaded = load_paths([REPO / "docs" / "bench" / "cpu-vllm"])
    assert loaded.problems == [], "\n".join(p.render() for p in loaded.problems)
    v, t = loaded.contracts["tiny-llama-vllm-bf16"], loaded.contracts["tiny-llama-cpu-bf16"]
    for part in ("model", "artifact", "precision", "limits", "kv_cache", "target"):
        assert getattr(v, part) == getattr(t, part), part
    assert (v.precision.weights, v.precision.kv_cache) == ("bf16", "bf16")
    nodes = [loaded.nodes[n] for n in ("vllm-bf16-per-core", "transformers-bf16-per-core")]
    assert [[(c.index, c.cores, c.memory_gib) for c in n.cards] for n in nodes] == [
        [(0, [0], 2), (1, [1], 2)]
    ] * 2
    embedded = load_node(REPO / "node_descriptions" / "local-vllm.yaml").contracts[
        "tiny-llama-vllm"
    ]
    assert (
        embedded.limits == v.limits
        and embedded.kv_cache == v.kv_cache
        and embedded.sections == v.sections
    )
    assert embedded.target == v.target
    assert embedded.model.model_dump(exclude={"weights_gib"}) == v.model.model_dump(
        exclude={"weights_gib"}
    )
    assert (
        embedded.resolve(embedded.artifact.checkpoint).resolve()
        == v.resolve(v.artifact.checkpoint).resolve()
    )
