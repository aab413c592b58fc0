"""transformers.graph_shape_cache (forge/engines/transformers/graph_shapes.py): the file, its merge,
and the capture at load.

The capture itself needs CUDA graphs (a GPU; measured in docs/benchmarks.md, "forge ÷ direct on one
card"). Here it runs on the real CPU engine's batch processor with the two flags a graph tier sets
turned on and the forward replaced by a recorder of the key each prepared batch gets: what is
checked is that a listed shape is prepared under exactly that key (the key the engine looks its
graph up by), and the skips and the cache's state after."""
from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest

from forge.engines.transformers import graph_shapes as gs

HERE = Path(__file__).resolve().parent


def test_a_cache_file_is_read_in_order_without_repeats_and_refused_at_its_first_bad_line():
    text = "[64, 16384, 1024]\n\n[128, 16384, 1024]\n[64, 16384, 1024]\n"
    assert gs.parse_lines(text) == [(1, (64, 16384, 1024)), (3, (128, 16384, 1024))]
    for bad, line, words in (("[64, 16384, 1024]\n{\"q\": 1}\n", 2, "three positive integers"),
                             ("[64, 0, 1024]\n", 1, "three positive integers"),
                             ("[64, true, 1024]\n", 1, "three positive integers"),
                             ("[1, 2, 3]\n[4, 5\n", 2, "not JSON")):
        with pytest.raises(gs.ShapeFileError, match=words) as err:
            gs.parse_lines(bad)
        assert err.value.line == line
    many = "".join(json.dumps([64 * (i + 1), 16384, 1024]) + "\n" for i in range(gs.MAX_SHAPES + 1))
    with pytest.raises(gs.ShapeFileError, match=f"more than {gs.MAX_SHAPES}"):
        gs.parse_lines(many)


def test_a_file_too_large_to_be_a_cache_is_not_read(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text("[64, 16384, 1024]\n" + " " * gs.MAX_FILE_BYTES)
    with pytest.raises(gs.ShapeFileError, match="bytes: more than 4096 shapes take") as err:
        gs.read_shapes(path)
    assert err.value.line == 0
    assert gs.read_shapes(tmp_path / "not-written-yet.jsonl") == []


def test_a_shape_another_tier_wrote_is_named():
    fits = dict(budget=2048, q_padding=64, pool_tokens=131072)
    assert gs.shape_problem((2048, 131072, 131072), **fits) is None
    assert gs.shape_problem((1984, 16384, 2048), **fits) is None
    assert "more than limits.max_num_tokens" in gs.shape_problem((4096, 16384, 2048), **fits)
    assert "multiple of graph_q_padding (64)" in gs.shape_problem((96, 16384, 2048), **fits)
    assert "KV pool" in gs.shape_problem((64, 262144, 2048), **fits)


def test_each_geometry_has_its_own_file_in_the_folder():
    from types import SimpleNamespace

    from forge.config.models import Contract
    from forge.engines.transformers.backend import TransformersSection

    c = Contract.model_validate(
        dict(
            contract="t",
            backend="transformers",
            model=dict(
                architecture="LlamaForCausalLM",
                num_layers=4,
                num_kv_heads=4,
                head_dim=32,
                vocab_size=2048,
                weights_gib=0.011,
            ),
            artifact=dict(checkpoint="ckpt"),
            precision=dict(weights="bf16", kv_cache="bf16"),
            limits=dict(
                max_batch_size=64, max_num_tokens=2048, max_input_len=1536, max_output_len=512
            ),
            kv_cache=dict(
                tokens_per_block=128, max_tokens=131072, host_cache_size=0, block_reuse=True
            ),
            target=dict(kind="gpu", compute_capability="9.0"),
        )
    )
    section = TransformersSection(use_cuda_graph=True, graph_shape_cache="/x")
    plan = SimpleNamespace(contract=c, kv_pool_tokens=131072)
    assert gs.cache_file(plan, section) == Path("/x/t-b2048-q64-p131072.jsonl")
    other = SimpleNamespace(contract=c, kv_pool_tokens=65536)  # a card with half the pool
    assert gs.cache_file(other, section.model_copy(update={"graph_q_padding": 128})) == \
        Path("/x/t-b2048-q128-p65536.jsonl")


def test_merge_keeps_the_files_order_adds_only_new_shapes_and_stops_at_the_cap(
    tmp_path, monkeypatch
):
    path = tmp_path / "shapes.jsonl"
    # written even empty: the tier has run
    assert gs.merge_into(path, []) == 0 and path.read_text() == ""
    assert gs.merge_into(path, [(64, 16384, 1024), (128, 16384, 1024)]) == 2
    assert gs.merge_into(path, [(128, 16384, 1024), (256, 16384, 2048), (64, 16384, 1024)]) == 1
    assert gs.read_shapes(path) == [(64, 16384, 1024), (128, 16384, 1024), (256, 16384, 2048)]
    monkeypatch.setattr(gs, "MAX_SHAPES", 4)
    assert gs.merge_into(path, [(320, 16384, 2048), (384, 16384, 2048)]) == 1
    assert len(gs.read_shapes(path)) == 4
    path.write_text("[64, 16384, 1024]\nnot a shape\n")  # a damaged file is never overwritten
    with pytest.raises(gs.ShapeFileError, match="not JSON"):
        gs.merge_into(path, [(128, 16384, 1024)])
    assert path.read_text() == "[64, 16384, 1024]\nnot a shape\n"


def _merge_many(path: str, start: int) -> None:
    for i in range(start, start + 40):
        gs.merge_into(Path(path), [(64 * (i + 1), 16384, 2048)])


def test_engines_stopping_together_lose_none_of_each_others_shapes(tmp_path):
    """Four real processes merging into one file at once (engines of one tier on several cards):
    every shape kept."""
    path = tmp_path / "shapes.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_merge_many, args=(str(path), 40 * k)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(gs.read_shapes(path)) == sorted((64 * (i + 1), 16384, 2048) for i in range(160))


@pytest.mark.engine
def test_capture_prepares_each_listed_shape_under_its_own_key_and_gives_the_pool_back():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HERE))
    from test_transformers_backend import TINY, contract, plan_for

    from forge_bench.direct import DirectEngine

    # tiny tier: 512-token budget, a 16,384-token pool
    direct = DirectEngine(plan_for(contract(TINY)))
    manager = direct.manager()
    try:
        processor = manager.batch_processor
        runner, io, cache = processor.model_runner, processor.inputs_and_outputs, processor.cache
        report = gs.capture(processor, direct.model, [(64, 16384, 1024)])
        # the CPU tier pads nothing
        assert report["captured"] == 0 and "no varlen graphs" in report["why_not"]

        class Recorded:  # what a captured graph is to the buffer: reset() at the end
            def reset(self):
                pass

        prepared = []

        def record_key(model, batch):  # compute_batch of a graph tier captures under this key
            prepared.append(tuple(io._get_graph_key()))
            io.graphs.set_graph(io._get_graph_key(), Recorded())

        runner.pad_inputs = runner.use_cuda_graph_varlen = io.use_cuda_graph_varlen = True
        runner.compute_batch = record_key
        free = cache.compute_free_capacity()
        # a repeat: held after the first
        shapes = [(64, 16384, 1024), (512, 16384, 2048), (64, 16384, 1024),
                  (64, 16384, 3000),  # no batch has this longest key
                  (64, 16384, 32768)]                                         # longer than the pool
        report = gs.capture(processor, direct.model, shapes)
        assert prepared == [(64, 16384, 1024), (512, 16384, 2048)]
        assert {
            k: report[k] for k in ("listed", "captured", "held", "other_key", "no_room", "cut")
        } == dict(listed=5, captured=2, held=1, other_key=1, no_room=1, cut=False)
        assert gs.keys_of(processor) == [(64, 16384, 1024), (512, 16384, 2048)]
        # every block the fake requests took is back
        assert cache.compute_free_capacity() == free == 1.0
        assert "captured 2 of 5 cached graph shapes" in gs.describe(report)
    finally:
        direct.close()


@pytest.mark.engine
def test_an_engine_whose_tier_captures_no_graphs_neither_reads_nor_writes_its_cache(tmp_path):
    """The real CPU engine through the backend's factory, with a cache named but no CUDA graphs
    (validate warns): it loads and serves, reports no captures, and leaves the file alone at
    stop."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HERE))
    from test_transformers_backend import TINY, contract, req, run_all, start

    engine = start(contract(TINY, sections={"transformers": {"graph_shape_cache": str(tmp_path)}}))
    # the tiny tier: 512-token budget, 16,384-token pool
    path = gs.cache_file(engine.plan, engine.section)
    assert path == tmp_path / "tiny-llama-cpu-b512-q64-p16384.jsonl"
    path.write_text("[64, 16384, 1024]\n")
    try:
        assert "graph_shapes" not in engine.describe()
        got, _ = run_all(engine, [req(engine, "a", "hello", 4)])
        assert got["a"].error is None and got["a"].output_ids
    finally:
        engine.shutdown(10)
    assert path.read_text() == "[64, 16384, 1024]\n" and [p.name for p in tmp_path.iterdir()] == [
        path.name
    ]
    assert not gs.in_use(engine.section)
    graphs = engine.section.model_copy(update={"use_cuda_graph": True})
    assert gs.in_use(graphs) and not gs.in_use(graphs.model_copy(update={"async_batching": True}))


def test_a_sweep_candidate_written_elsewhere_keeps_its_cache_folder(tmp_path):
    """tierfile rebases the cache folder like the artifact's, so a candidate or --write-best copy
    names the same folder (a candidate of another budget or padding then keeps its own file
    there)."""
    from forge_bench.tierfile import contract_data
    from forge.config.load import load_paths

    case = HERE.parent / "cases" / "invalid" / "graph-shape-cache"
    loaded = load_paths([case / "contract-ok.yaml"])
    assert loaded.ok, [p.render() for p in loaded.errors]
    data = contract_data(loaded.contracts["t-gsc-ok"], tmp_path / "somewhere" / "else")
    assert (
        tmp_path / "somewhere" / "else" / data["transformers"]["graph_shape_cache"]
    ).resolve() == (case / "shapes").resolve()


@pytest.mark.engine
def test_the_engine_reads_its_geometrys_file_at_load_and_writes_it_at_stop(tmp_path, monkeypatch):
    """The wiring on the real CPU engine, with the cache taken as in use (on a GPU tier:
    use_cuda_graph): the factory captures from the geometry's file before the loop starts (here
    nothing: the CPU loop captures no graphs, and the report says so), and shutdown merges what the
    engine holds into that file (none here: the file the tier had not written yet now exists,
    empty)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HERE))
    from test_transformers_backend import TINY, contract, req, run_all, start

    monkeypatch.setattr(gs, "in_use", lambda section: section.graph_shape_cache is not None)
    path = tmp_path / "tiny-llama-cpu-b512-q64-p16384.jsonl"
    engine = start(contract(TINY, sections={"transformers": {"graph_shape_cache": str(tmp_path)}}))
    try:
        report = engine.describe()["graph_shapes"]
        assert report["file"] == str(path) and "no varlen graphs" in report["why_not"]
        got, _ = run_all(engine, [req(engine, "a", "hello", 4)])
        assert got["a"].error is None
    finally:
        assert not path.exists()
        engine.shutdown(10)
    assert path.read_text() == ""
