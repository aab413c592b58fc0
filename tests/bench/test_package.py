"""forge-bench as a package of its own (bench/): reached through one plugin declared as an entry
point, and no import circle between its modules (nor between forge/report's, whose writer it
shares), lazy imports included."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def module_imports(package: Path, prefix: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, anywhere in the file (a lazy import
    counts)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = [prefix, *path.relative_to(package).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            for dotted in found:
                while dotted and dotted not in modules:
                    dotted = dotted.rpartition(".")[0]
                # a module's own package
                if dotted and dotted != name and not name.startswith(dotted + "."):
                    deps.add(dotted)
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of two or more modules that import each other, directly or round a longer loop."""
    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    reach = {m: reaches(m) for m in graph}
    groups = {
        frozenset({m, *(n for n in reach[m] if m in reach.get(n, ()))})
        for m in graph
        if m in reach[m]
    }
    return sorted(sorted(g) for g in groups)


@pytest.mark.parametrize("package, prefix", [(ROOT / "bench" / "forge_bench", "forge_bench"),
                                             (ROOT / "forge" / "report", "forge.report")])
def test_no_import_circle_between_modules(package, prefix):
    assert circles(module_imports(package, prefix)) == []


def test_the_circle_check_sees_a_lazy_circle(tmp_path):
    (tmp_path / "a.py").write_text("from p.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from p.a import y\n")
    (tmp_path / "c.py").write_text("import p.a\n")
    assert circles(module_imports(tmp_path, "p")) == [["p.a", "p.b"]]


def test_one_entry_point_in_forge_s_group_is_the_plugin():
    """What pip installs from bench/pyproject.toml, and what `FORGE_LOAD_PLUGINS` names in the
    tests."""
    from tests.forge_cli import TEST_PLUGINS

    project = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"
    ]
    assert project["entry-points"]["forge"] == {"bench": TEST_PLUGINS}
    assert project["dependencies"] == ["forge-llm"]


@pytest.mark.slow
def test_forge_without_forge_bench_says_how_to_install_it():
    """forge-bench left out (FORGE_LOAD_PLUGINS names no plugin): `forge bench` is one line saying
    what to install, exit code 2, and the test engines are unknown backends; with it, the same
    command runs as before."""
    from tests.forge_cli import forge

    without = forge("bench", "run", "bench/forge_bench/quick.yaml", env={"FORGE_LOAD_PLUGINS": ""})
    assert (without.returncode, without.stdout) == (2, "")
    assert without.stderr == ("forge: `forge bench` comes with the forge-bench package, not "
                              "installed here (or left "
                              "out by FORGE_LOAD_PLUGINS): in a forge checkout, pip install -e "
                              "'.[bench]' -e ./bench\n")
    engines = forge(
        "validate", "tests/reliability/fixtures/nodes/instant.yaml", env={"FORGE_LOAD_PLUGINS": ""}
    )
    assert (
        engines.returncode != 0 and "unknown backend 'instant'" in engines.stderr + engines.stdout
    )
    with_it = forge("bench", "--help")
    assert with_it.returncode == 0 and "Usage: forge bench [OPTIONS] COMMAND" in with_it.stdout
