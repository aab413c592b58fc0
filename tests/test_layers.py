"""forge's packages import only downward, and no two of them import each other
(docs/architecture.md's table).

Every `import` and `from ... import` in forge/, at module level or inside a function (a lazy import
is still a dependency), is read from the source with ast; each names a unit: a package under forge/
(`forge/node/...` is `node`) or a top-level module (`forge/requests/` is `requests`). A unit may
import units of a lower layer and nothing above its own; a new upward import, or a circle between
units, fails here with the file and line.

    python -m pytest -q tests/test_layers.py
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

FORGE = Path(__file__).resolve().parent.parent / "forge"

# Lowest first. A unit may import its own layer's *other* units only where no circle results
# (checked below).
LAYERS: tuple[tuple[str, ...], ...] = (
    # plain values, no behaviour
    ("errors", "constants", "stats", "prefix_blocks", "hookspecs", "embedded", "fit", "atomic"),
    ("plugins", "gc_tuning", "backends"),       # backends: the registered Backend objects
    ("tunables", "config"),              # formats, load, checks, plan
    ("engines", "hardware", "records"),  # backends (plugins), the hardware probe, record I/O
    ("requests", "ledger", "metrics", "report", "broker", "web", "machine", "watchdogs"),
    ("host",),                                     # the card worker: admission around one engine
    ("link",),                                     # node <-> host
    ("node",),
    ("functions",),                                # what a function author sees, the job loop
    ("serve", "cluster", "top", "openai_batch"),   # the products built on a node and the functions
    ("cli",),
    ("__main__",),
)

# The few imports that go up on purpose, each with its reason. Nothing else may.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # `import forge; forge.function, forge.LLM, forge.Generation`: the package's public names for
    # function authors, resolved lazily (PEP 562 __getattr__) on first use, so `import forge` itself
    # stays cheap.
    ("forge", "functions"): "the package facade's lazy re-export of the function-author API",
}

RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit_of_path(path: Path) -> str:
    rel = path.relative_to(FORGE)
    if len(rel.parts) == 1:
        return "forge" if rel.name == "__init__.py" else rel.stem
    return rel.parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(FORGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of_module(dotted: str) -> str:
    parts = dotted.split(".")
    if len(parts) == 1:
        return "forge"
    return parts[1]


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(unit imported, line) for every forge import in one file; relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "forge" or alias.name.startswith("forge."):
                    found.append((unit_of_module(alias.name), node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                dotted = ".".join(base + ([node.module] if node.module else []))
            else:
                dotted = node.module or ""
            if not (dotted == "forge" or dotted.startswith("forge.")):
                continue
            if dotted == "forge":  # `from forge import constants`: the names are the units
                for alias in node.names:
                    sub = alias.name
                    is_unit = (FORGE / sub).is_dir() or (FORGE / f"{sub}.py").is_file()
                    found.append((sub if is_unit else "forge", node.lineno))
            else:
                found.append((unit_of_module(dotted), node.lineno))
    return found


def edges() -> dict[tuple[str, str], list[str]]:
    """(importer unit, imported unit) -> where, for every import between two different units."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(FORGE.rglob("*.py")):
        src = unit_of_path(path)
        for dst, line in imports_of(path):
            if dst != src:
                out.setdefault((src, dst), []).append(f"{path.relative_to(FORGE.parent)}:{line}")
    return out


def test_every_unit_of_forge_has_a_layer():
    units = {unit_of_path(p) for p in FORGE.rglob("*.py")} - {"forge"}
    missing = sorted(units - set(RANK))
    assert not missing, (
        f"add these to LAYERS in tests/test_layers.py (and docs/architecture.md's table): {missing}"
    )


def test_no_package_imports_upward():
    bad = []
    for (src, dst), where in sorted(edges().items()):
        if (src, dst) in ALLOWED_UPWARD:
            continue
        if src == "forge" or RANK.get(dst, -1) > RANK.get(src, len(LAYERS)):
            bad.append(f"{src} -> {dst} (layer {RANK.get(src)} imports layer {RANK.get(dst)}): "
                       f"{', '.join(where)}")
    assert not bad, "upward imports between forge's packages:\n" + "\n".join(bad)


def test_no_import_circle_between_packages():
    graph: dict[str, set[str]] = {}
    for (src, dst) in edges():
        if (src, dst) not in ALLOWED_UPWARD:
            graph.setdefault(src, set()).add(dst)
    # Tarjan's strongly connected components: any component of two or more units is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles between forge's packages: {circles}"


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The test above can fail: a node module that imports the functions package is reported."""
    fake = tmp_path / "forge"
    (fake / "node").mkdir(parents=True)
    (fake / "functions").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "node" / "__init__.py").write_text("")
    (fake / "functions" / "__init__.py").write_text("")
    (fake / "node" / "bad.py").write_text("def f():\n    from forge.functions.api import "
                                          "GenerateParams\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["FORGE"]), "FORGE", fake)
    assert edges() == {("node", "functions"): ["forge/node/bad.py:2"]}
    try:
        test_no_package_imports_upward()
    except AssertionError as e:
        assert "node -> functions" in str(e) and "forge/node/bad.py:2" in str(e)
    else:
        raise AssertionError("an upward import was not reported")


def imports_of_bench(root: Path) -> list[str]:
    """Where a module under root imports forge_bench, by statement or by name (importlib, plugin
    lists)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [node.value]
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                else []
            )
            if any(name == "forge_bench" or name.startswith("forge_bench.") for name in names):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_forge_never_imports_forge_bench(tmp_path):
    """forge-bench (bench/) is built on forge and reaches it only through the plugin hooks; the core
    runs without it. The check can fail: a lazy import and a module named in a string are both
    found."""
    assert not imports_of_bench(FORGE), f"forge imports forge_bench: {imports_of_bench(FORGE)}"
    (tmp_path / "forge").mkdir()
    (tmp_path / "forge" / "bad.py").write_text("import importlib\n\n\ndef f():\n    from "
                                               "forge_bench import cli\n"
                                             "    importlib.import_module('forge_bench.plugin')\n")
    assert imports_of_bench(tmp_path / "forge") == ["forge/bad.py:5", "forge/bad.py:6"]


# --- circles between modules
# --------------------------------------------------------------------------------------- Units
# above may import each other only downward; inside a unit too, no two modules may need each other
# (a circle works only as long as one side's import stays lazy or comes last, and breaks on the next
# edit). Every import counts, a lazy one too; only an `if TYPE_CHECKING:` block (never run) is left
# out.


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:` (its else branch runs, so it
    counts)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def module_imports_of(path: Path, package_root: Path) -> list[tuple[str, int]]:
    """(module imported, line) for every import in one file of the package at `package_root`
    (forge/) that runs and names one of its modules: `from P import name` imports the module P.name
    where there is one, else P itself."""
    top = package_root.name

    def exists(dotted: str) -> bool:
        where = package_root.parent.joinpath(*dotted.split("."))
        return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = ".".join(path.relative_to(package_root.parent).with_suffix("").parts).removesuffix(
        ".__init__"
    )
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in _run_nodes(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == top]
        elif isinstance(node, ast.ImportFrom):
            base = (
                package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            )
            dotted = ".".join(base + ([node.module] if node.module else []))
            if dotted.split(".")[0] != top:
                continue
            for alias in node.names:
                sub = f"{dotted}.{alias.name}"
                found.append((sub if exists(sub) else dotted, node.lineno))
    return found


def module_edges(package_root: Path) -> dict[tuple[str, str], list[str]]:
    """(importer module, imported module) -> where, for every import between two modules of one
    package."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(package_root.rglob("*.py")):
        src = ".".join(path.relative_to(package_root.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        )
        for dst, line in module_imports_of(path, package_root):
            where = f"{path.relative_to(package_root.parent)}:{line}"
            if dst != src and where not in out.get((src, dst), ()):
                out.setdefault((src, dst), []).append(where)
    return out


def circles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more nodes (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


# forge, and forge-bench (bench/forge_bench, a distribution of its own built on forge) beside it
PACKAGE_ROOTS = [FORGE] + [p for p in [FORGE.parent / "bench" / "forge_bench"] if p.is_dir()]


@pytest.mark.parametrize("package_root", PACKAGE_ROOTS, ids=[p.name for p in PACKAGE_ROOTS])
def test_no_import_circle_between_modules(package_root):
    found = module_edges(package_root)
    graph: dict[str, set[str]] = {}
    for (src, dst) in found:
        graph.setdefault(src, set()).add(dst)
    report = []
    for circle in circles_in(graph):
        inside = [
            f"  {src} -> {dst}: {', '.join(where)}"
            for (src, dst), where in sorted(found.items())
            if src in circle and dst in circle
        ]
        report.append(" <-> ".join(circle) + "\n" + "\n".join(inside))
    assert not report, f"import circles between {package_root.name}'s modules:\n" + "\n".join(
        report
    )


def test_the_check_sees_a_circle_between_modules(tmp_path):
    """The test above can fail: a lazy import closing a circle inside one package is reported; an
    import under `if TYPE_CHECKING:` is not one."""
    fake = tmp_path / "forge"
    (fake / "node").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "node" / "__init__.py").write_text("")
    (fake / "node" / "a.py").write_text("from forge.node import b\n")
    (fake / "node" / "b.py").write_text("def f():\n    from . import a\n")
    (fake / "node" / "c.py").write_text("from typing import TYPE_CHECKING\nimport forge.node.a\n"
                                        "if TYPE_CHECKING:\n    from forge.node.d import D\n")
    (fake / "node" / "d.py").write_text("from forge.node.c import C\n")
    assert module_edges(fake) == {("forge.node.a", "forge.node.b"): ["forge/node/a.py:1"],
                              ("forge.node.b", "forge.node.a"): ["forge/node/b.py:2"],
                              ("forge.node.c", "forge.node.a"): ["forge/node/c.py:2"],
                              ("forge.node.d", "forge.node.c"): ["forge/node/d.py:1"]}
    graph: dict[str, set[str]] = {}
    for (src, dst) in module_edges(fake):
        graph.setdefault(src, set()).add(dst)
    # c <-> d only under TYPE_CHECKING
    assert circles_in(graph) == [["forge.node.a", "forge.node.b"]]
    try:
        test_no_import_circle_between_modules(fake)
    except AssertionError as e:
        assert "forge.node.a <-> forge.node.b" in str(e) and "forge/node/b.py:2" in str(e), e
    else:
        raise AssertionError("a circle between modules was not reported")
