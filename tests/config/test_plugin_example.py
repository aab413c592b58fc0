"""The example plugin package under plugins/: registered like any plugin, its rule runs with the
built-ins."""
from __future__ import annotations

import importlib
import sys
import tomllib

import pytest

from forge import plugins
from forge.config.load import load_paths
from tests.config.conftest import REPO, node, trt_contract

PLUGIN = REPO / "plugins" / "forge-example-rule"


@pytest.fixture
def example_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN / "src"))
    mod = importlib.import_module("forge_example_rule")
    plugins.load_plugins()                      # built-ins first, as forge does
    plugins.pm.register(mod, name="forge_example_rule")
    plugins.pm.check_pending()                  # a misspelled hook would fail here
    try:
        yield mod
    finally:
        plugins.pm.unregister(mod)
        sys.modules.pop("forge_example_rule", None)


def test_the_package_registers_an_entry_point_in_the_forge_group():
    meta = tomllib.loads((PLUGIN / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["forge"] == {"example_rule": "forge_example_rule"}


def test_its_rule_fires_on_a_card_without_headroom(example_plugin, write, tmp_path, monkeypatch):
    write("t1k.yaml", trt_contract(**{"kv_cache.free_gpu_memory_fraction": 0.99}))
    write("node.yaml", node())
    monkeypatch.chdir(tmp_path)
    loaded = load_paths(["."])
    (problem,) = loaded.problems
    assert problem.file == "node.yaml" and problem.path == "$.cards[0]"
    assert problem.message.startswith("headroom 0.25 GiB on NVIDIA GeForce RTX 5090 is below the "
                                      "site minimum")


def test_its_rule_is_quiet_on_the_examples(example_plugin):
    loaded = load_paths([REPO / "node_descriptions"])
    assert loaded.ok and loaded.problems == []


def test_its_threshold_is_a_setting(example_plugin, monkeypatch):
    monkeypatch.setenv("FORGE_MIN_HEADROOM_GIB", "2")
    loaded = load_paths([REPO / "node_descriptions" / "fabric-a.yaml"])
    assert [p.path for p in loaded.errors] == ["$.cards[1]"]       # the 16 GB card keeps 1.32 GiB


def test_without_the_plugin_the_rule_does_not_run(write, tmp_path, monkeypatch):
    write("t1k.yaml", trt_contract(**{"kv_cache.free_gpu_memory_fraction": 0.99}))
    write("node.yaml", node())
    monkeypatch.chdir(tmp_path)
    assert load_paths(["."]).problems == []
