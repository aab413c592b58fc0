"""The loader's public API as the rest of forge uses it."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from forge.config.load import LoadedDescription, load_node, load_paths
from forge.config.registry import Registry, build
from forge.errors import ConfigError, ForgeError
from tests.config.conftest import REPO, node, trt_contract


def test_load_node_returns_node_contracts_plans_and_warnings(write, tmp_path):
    write("t1k.yaml", trt_contract())
    path = write("node.yaml", node(**{"cards": [dict(node()["cards"][0], memory_gib=16)]}))
    loaded = load_node(path)
    assert isinstance(loaded, LoadedDescription)
    assert loaded.node.node == "n" and loaded.node.source == path
    assert (
        list(loaded.contracts) == ["t1k"]
        and loaded.contracts["t1k"].source == tmp_path / "t1k.yaml"
    )
    assert [p.full_length_slots for p in loaded.plans] == [106]
    (w,) = loaded.warnings
    assert w.severity == "warning" and w.path == "$.cards[0].engine"


def test_strict_turns_the_slots_warning_into_an_error(write):
    write("t1k.yaml", trt_contract())
    path = write("node.yaml", node(**{"cards": [dict(node()["cards"][0], memory_gib=16)]}))
    with pytest.raises(ConfigError) as e:
        load_node(path, strict=True)
    assert [p.severity for p in e.value.problems] == ["error"]
    assert "holds 106 full-length sequences" in str(e.value)


def test_load_node_refuses_a_contract_file():
    with pytest.raises(ConfigError, match=r"::\$: expected a node description"):
        load_node(REPO / "forge" / "embedded" / "tiny-llama-cpu.yaml")


def test_load_node_reports_every_problem_of_the_file(write):
    path = write("node.yaml", node(**{"host.cpu_cores": 0, "metrics.port": "x", "cards": []}))
    with pytest.raises(ConfigError) as e:
        load_node(path)
    assert sorted(p.path for p in e.value.problems) == [
        "$.cards",
        "$.host.cpu_cores",
        "$.metrics.port",
    ]


def test_model_rules_land_on_their_section(write, tmp_path, monkeypatch):
    write("c.yaml", trt_contract(**{"kv_cache.max_tokens": 4096}))
    monkeypatch.chdir(tmp_path)
    (p,) = load_paths(["c.yaml"]).problems
    assert (
        p.render()
        == "c.yaml::$.kv_cache: exactly one of free_gpu_memory_fraction | max_tokens must be given"
    )


def test_contract_paths_resolve_against_the_contract_file(write, tmp_path):
    write("tiers/c.yaml", trt_contract(**{"artifact.engine_dir": "../../engines/x"}))
    # the registered backends: trtllm reads the engine directory
    loaded = load_paths([tmp_path / "tiers"])
    assert [p.message for p in loaded.errors] == ["engine directory "
                                                  f"{tmp_path.parent / 'engines/x'} does not exist"]


def test_registered_sections_are_validated_and_stored(write, tmp_path, monkeypatch):
    class Knobs(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
        threads: int

    reg = build([("trtllm", None, Knobs)], [], [])
    write("good.yaml", dict(trt_contract(), trtllm={"threads": 4}))
    write("bad.yaml", dict(trt_contract(contract="bad"), trtllm={"thread": 4}))
    monkeypatch.chdir(tmp_path)
    loaded = load_paths(["."], registry=reg)
    assert isinstance(loaded.contracts["t1k"].sections["trtllm"], Knobs)
    assert loaded.contracts["t1k"].sections["trtllm"].threads == 4
    assert sorted(p.render() for p in loaded.problems) == [
        "bad.yaml::$.trtllm.thread: unknown key 'thread' (did you mean 'threads'?)",
        "bad.yaml::$.trtllm.threads: missing required key"]


def test_unknown_backend_suggests_the_known_ones(write, tmp_path, monkeypatch):
    write("c.yaml", trt_contract(backend="trtlm"))
    monkeypatch.chdir(tmp_path)
    (p,) = load_paths(
        ["c.yaml"], registry=build([("trtllm", None), ("transformers", None)], [], [])
    ).problems
    assert p.render() == "c.yaml::$.backend: unknown backend 'trtlm' (did you mean 'trtllm'?)"


def test_plugin_registrations_that_clash_are_refused():
    class S(BaseModel):
        pass

    with pytest.raises(ForgeError, match="clashes with a built-in contract key"):
        build([], [("limits", S)], [])
    with pytest.raises(ForgeError, match="registered twice"):
        build([("a", None), ("a", None)], [], [])


def test_a_failing_plugin_rule_is_named(write, tmp_path):
    def broken_rule(loaded):
        raise KeyError("boom")

    write("c.yaml", trt_contract())
    with pytest.raises(ForgeError, match="broken_rule"):
        load_paths(
            [tmp_path], registry=Registry(backends=frozenset({"trtllm"}), rules=(broken_rule,))
        )


def test_same_file_twice_is_loaded_once(write, tmp_path):
    path = write("c.yaml", trt_contract())
    loaded = load_paths([path, tmp_path, str(path)])
    assert loaded.files_checked == 1 and loaded.ok


def test_an_empty_folder_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "none").mkdir()
    monkeypatch.chdir(tmp_path)
    (p,) = load_paths(["none"]).problems
    assert p.render() == "none::$: no .yaml/.yml files in this folder"


def test_a_copied_node_file_names_where_its_relative_contracts_point(tmp_path, monkeypatch):
    """node_descriptions/local.yaml copied elsewhere: `contracts: ../forge/...` now points nowhere, and the
    error says where it looked, as an absolute path, whatever the current folder."""
    (tmp_path / "work").mkdir()
    copy = tmp_path / "work" / "mynode.yaml"
    copy.write_text((REPO / "node_descriptions" / "local.yaml").read_text())
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(ConfigError) as e:
        load_node(Path("mynode.yaml"))
    looked = tmp_path / "forge" / "embedded" / "tiny-llama-cpu.yaml"
    assert str(e.value) == ("mynode.yaml::$.contracts: '../forge/embedded/tiny-llama-cpu.yaml' "
                            "(relative to the node "
                            f"file's folder: {looked}) does not exist")
