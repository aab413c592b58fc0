"""`forge validate` reports every independent problem of a set of files in one pass: a node with a
structural error still has its contracts read and checked (before, it said `0 contract(s)` and the
contract's own problems only showed once the node was fixed)."""
import shutil

from tests.forge_cli import REPO, invoke

NODE = """node: broken
contracts: {contracts}
host:
  memory_gib: 4
  cpu_cores: 2
cards:
  - index: 0
    kind: tpu
    model: cpu
    memory_gib: 2
    engine: tiny-llama-cpu
metrics:
  port: 0
"""


def _contract(tmp_path, budget: int):
    shutil.copytree(REPO / "forge" / "embedded" / "tiny-llama", tmp_path / "tiny-llama")
    text = (REPO / "forge" / "embedded" / "tiny-llama-cpu.yaml").read_text()
    (tmp_path / "c.yaml").write_text(
        text.replace("max_num_tokens: 512", f"max_num_tokens: {budget}")
    )


def test_a_broken_node_still_has_its_contracts_checked(tmp_path):
    _contract(tmp_path, 100)
    (tmp_path / "n.yaml").write_text(NODE.format(contracts="c.yaml"))
    r = invoke("validate", "n.yaml", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "n.yaml::$.cards[0].kind: unknown value 'tpu' (did you mean 'gpu'?)",
        "c.yaml::$.limits.max_num_tokens: max_num_tokens 100 is below max_input_len 384: a "
        "full-length prompt could "
        "never be scheduled in one step"]
    assert "2 file(s), 0 node(s), 1 contract(s): INVALID (2 error(s), 0 warning(s))" in r.stderr


def test_a_broken_node_naming_a_missing_contract_says_both(tmp_path):
    (tmp_path / "n.yaml").write_text(NODE.format(contracts="[c.yaml, gone.yaml]"))
    _contract(tmp_path, 512)
    r = invoke("validate", "n.yaml", cwd=tmp_path)
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and len(lines) == 2, r.stdout
    assert lines[0].startswith("n.yaml::$.cards[0].kind: unknown value 'tpu'")
    assert lines[1].startswith("n.yaml::$.contracts[1]: 'gone.yaml' (relative to the node file's "
                               "folder: ")
    assert "1 contract(s)" in r.stderr          # c.yaml was read, and is valid
