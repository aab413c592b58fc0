"""The digest that tells a `forge run` whether a node already up is the one it would provision: the
same for the same content wherever the description lies; different for any changed field, a model in
another folder or rewritten in place, or a setting in the environment."""
import os
import shutil

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from forge.machine.warm_node import description_digest
from tests.forge_cli import REPO


def test_the_packaged_local_and_its_copy_in_node_descriptions_are_one_node():
    assert description_digest(load_node(PACKAGED_NODES["local"])) == \
        description_digest(load_node(REPO / "node_descriptions/local.yaml"))


def test_a_changed_field_of_the_node_or_its_contract_is_another_node(tmp_path):
    here = tmp_path / "local.yaml"
    node_text = (REPO / "node_descriptions/local.yaml").read_text()
    here.write_text(node_text.replace("../forge/embedded/tiny-llama-cpu.yaml",
                                      str(REPO / "forge/embedded/tiny-llama-cpu.yaml")))
    base = description_digest(load_node(here))
    assert base == description_digest(load_node(PACKAGED_NODES["local"]))

    here.write_text(here.read_text().replace("memory_gib: 4 ", "memory_gib: 3 "))
    assert description_digest(load_node(here)) != base

    # the same contract text beside a copy of its model: another checkpoint folder, another node
    shutil.copytree(REPO / "forge/embedded/tiny-llama", tmp_path / "tiny-llama")
    shutil.copy(REPO / "forge/embedded/tiny-llama-cpu.yaml", tmp_path / "tiny-llama-cpu.yaml")
    here.write_text(
        node_text.replace("../forge/embedded/tiny-llama-cpu.yaml", "tiny-llama-cpu.yaml")
    )
    moved = description_digest(load_node(here))
    assert moved != base

    weights = next((tmp_path / "tiny-llama").glob("*.safetensors"))
    # rewritten in place
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    rewritten = description_digest(load_node(here))
    assert rewritten != moved

    contract = tmp_path / "tiny-llama-cpu.yaml"
    contract.write_text(contract.read_text().replace("max_batch_size: 32", "max_batch_size: 16"))
    assert description_digest(load_node(here)) != rewritten


def test_a_setting_in_the_environment_is_another_node_and_a_token_is_not(monkeypatch):
    loaded = load_node(PACKAGED_NODES["local"])
    base = description_digest(loaded)
    monkeypatch.setenv("FORGE_TOKEN", "a secret")          # checked against the node, never hashed
    assert description_digest(loaded) == base
    # the node's cards and the run would each read it
    monkeypatch.setenv("FORGE_STALL_WINDOW_S", "600")
    assert description_digest(loaded) != base
