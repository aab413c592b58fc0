"""Hostile or broken files: one line naming the file, fast, in bounded memory."""
from __future__ import annotations

import os
import time
import tracemalloc

import pytest

from forge import constants
from forge.config.load import load_paths
from tests.config.conftest import trt_contract


def _billion_laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def _few_alias_bomb() -> str:
    # 29 levels of two aliases each: under the alias count, 2**29 values once expanded.
    lines = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias-bomb": (_billion_laughs(), "more than 64 YAML aliases"),
    "few-alias-bomb": (_few_alias_bomb(), "alias bomb"),
    "recursive-alias": ("node: &a [*a]\n", "recursive YAML alias"),
    "binary": (bytes(range(256)) * 8, "binary file"),
    "empty": ("", "empty file"),
    "whitespace": ("   \n\n# only a comment\n", "empty file"),
    "top-level-list": ("- node: a\n- contract: b\n", "expected a mapping, got a list"),
    "huge": ("node: x\n#" + "x" * (constants.MAX_CONFIG_FILE_BYTES + 10) + "\n", "the limit is"),
    "non-utf8": ("node: café\n".encode("latin-1"), "not UTF-8 text"),
    "deep-flow": ("[" * 10_000 + "]" * 10_000 + "\n", "nested deeper than 32 levels"),
    "deep-map": ("{a: " * 10_000 + "1" + "}" * 10_000 + "\n", "nested deeper than 32 levels"),
    "python-tag": ("node: !!python/object/apply:os.system [ls]\n", "could not determine a "
                                                                   "constructor"),
    "two-documents": ("node: a\n---\nnode: b\n", "expected a single document"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_one_line(name, write, tmp_path, monkeypatch):
    data, fragment = HOSTILE[name]
    write(f"{name}.yaml", data)
    monkeypatch.chdir(tmp_path)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        loaded = load_paths([f"{name}.yaml"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5.0
    assert peak < 64 * 2**20, f"peak {peak} bytes"
    assert [p.render() for p in loaded.problems] == [p.render() for p in loaded.problems[:1]]
    (problem,) = loaded.problems
    assert problem.file == f"{name}.yaml" and problem.path == "$" and problem.severity == "error"
    assert fragment in problem.message and "\n" not in problem.message


def test_symlink_loop_in_a_folder_argument(write, tmp_path, monkeypatch):
    write("nodes/t1k.yaml", trt_contract())
    os.symlink("..", tmp_path / "nodes" / "up")            # a folder that contains its own parent
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    loaded = load_paths(["nodes"])
    assert time.monotonic() - t0 < 5.0
    assert loaded.ok and list(loaded.contracts) == ["t1k"] and loaded.files_checked == 1
    (problem,) = loaded.problems
    assert problem.severity == "warning" and "symlink loop" in problem.message
    assert problem.file == "nodes/up/nodes"


def test_symlinked_files_pointing_at_each_other(tmp_path, monkeypatch):
    os.symlink("b.yaml", tmp_path / "a.yaml")
    os.symlink("a.yaml", tmp_path / "b.yaml")
    monkeypatch.chdir(tmp_path)
    loaded = load_paths(["."])
    assert sorted(p.render() for p in loaded.errors) == [
        "a.yaml::$: symlink loop",
        "b.yaml::$: symlink loop",
    ]


def test_a_fifo_is_refused_without_blocking(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "pipe.yaml")
    monkeypatch.chdir(tmp_path)
    (problem,) = load_paths(["pipe.yaml"]).problems
    assert problem.render() == "pipe.yaml::$: not a regular file"


def test_duplicate_keys_are_refused(write, tmp_path, monkeypatch):
    write("dup.yaml", "node: a\ncontracts: .\nnode: b\n")
    monkeypatch.chdir(tmp_path)
    (problem,) = load_paths(["dup.yaml"]).problems
    assert problem.message == "duplicate key 'node' (line 3, column 1)"


def test_timestamps_stay_strings(write, tmp_path, monkeypatch):
    from forge.config.yamlsafe import load_yaml

    assert load_yaml("when: 2024-01-02\n") == {"when": "2024-01-02"}


def test_a_bounded_alias_bomb_in_a_closed_field_is_described_not_quoted(
    write, tmp_path, monkeypatch
):
    """65,536 values once expanded (under the loader's bound): refused with a short line, in bounded
    CPU. It was quoted whole in the message (and compared by difflib with every choice), which the
    --long fuzz run timed."""
    import yaml

    bomb = "&a0 [lol, lol, lol, lol]"
    for i in range(1, 8):  # each level defined inline, then aliased: 4**8 values once expanded
        bomb = f"&a{i} [{bomb}, *a{i - 1}, *a{i - 1}, *a{i - 1}]"
    contract = trt_contract(**{"precision.weights": "PLACEHOLDER"})
    write(
        "c.yaml",
        yaml.safe_dump(contract, width=10**6).replace("weights: PLACEHOLDER", f"weights: {bomb}"),
    )
    monkeypatch.chdir(tmp_path)
    c0 = time.process_time()
    loaded = load_paths(["c.yaml"])
    assert time.process_time() - c0 < 2.0
    mine = [p for p in loaded.problems if p.path == "$.precision.weights"]
    assert mine and all(len(p.render()) < 200 for p in mine), [p.render()[:300] for p in mine]
    assert any(
        "unknown value: got a list (expected one of: fp32, bf16, fp16, fp8, int4)" in p.message
        for p in mine
    )
