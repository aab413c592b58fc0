"""Every test the docs cite exists: a guarantee is only as good as the test named beside it.

The docs (README.md, docs/*.md, docs/bench/*.md) name tests as `tests/PATH.py::NAME`, as `::NAME`
after such a reference on the same line (the same file), or as `FILE.py::NAME` where FILE.py is a
test file's name (looked up under tests/). Each named file must exist and define NAME (a test
function, or a class, at module level or in a class); a bare `tests/PATH.py` or `tests/DIR/` must
exist. Reads the files' syntax trees, imports nothing."""

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "bench").glob("*.md")]
)
# Paths of other projects' tests that the docs cite as theirs, not forge's.
# TensorRT-LLM's (docs/trtllm.md)
OTHER_PROJECTS = {"tests/unittest/_torch/sampler/test_torch_sampler.py"}

# `tests/a/b.py::name`, `tests/a/b.py`, `tests/a/` ; `::name` continuing the last file on the line;
# `b.py::name` naming a test file by its name alone.
REFERENCE = re.compile(
    r"(?P<path>tests/[\w./-]*\w(?:\.py|/))(?:::(?P<name>\w+))?"
    r"|(?<![\w/.])::(?P<more>\w+)"
    r"|(?<![\w/.-])(?P<bare>test_\w+\.py)(?:::(?P<bare_name>\w+))?"
    r"|`(?P<listed>test_\w+)`"
)


@cache
def defined_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(item.name for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return frozenset(names)


@cache
def files_named_in_tests(filename: str) -> tuple[Path, ...]:
    return tuple(sorted((ROOT / "tests").rglob(filename)))


def references_in(text: str):
    """(line number, file path or None, test name or None, the reference as written) for every
    reference."""
    for number, line in enumerate(text.splitlines(), 1):
        current = None
        for match in REFERENCE.finditer(line):
            if match["path"] in OTHER_PROJECTS:
                current = None
            elif match["path"]:
                current = match["path"]
                yield number, current, match["name"], match[0]
            elif match["more"] or match["listed"]:
                if current is not None and current.endswith(".py"):
                    yield number, current, match["more"] or match["listed"], match[0]
            else:
                candidates = files_named_in_tests(match["bare"])
                current = str(candidates[0].relative_to(ROOT)) if len(candidates) == 1 else None
                if match["bare_name"] or not candidates:
                    yield number, None, match["bare_name"], match[0]


def problems_in(text: str, label: str) -> list[str]:
    found = []
    for number, path, name, written in references_in(text):
        where = f"{label}:{number}: {written}"
        if path is None:  # FILE.py::NAME: some test file of that name defines NAME
            bare = written.split("::")[0]
            files = files_named_in_tests(bare)
            if not files:
                found.append(f"{where}: no file named {bare} under tests/")
            elif not any(name in defined_names(f) for f in files):
                found.append(f"{where}: no {name} in "
                             f"{', '.join(str(f.relative_to(ROOT)) for f in files)}")
            continue
        target = ROOT / path
        if not target.exists():
            found.append(f"{where}: {path} does not exist")
        elif name is not None and name not in defined_names(target):
            found.append(f"{where}: {path} defines no {name}")
    return found


def test_the_reference_pattern_reads_the_forms_the_docs_use():
    text = ("`tests/a/b.py::test_x`, `::test_y` and `test_c.py::test_z`\n"
            "`tests/a/` then `::test_w` (no file on this line)")
    assert list(references_in(text)) == [
        (1, "tests/a/b.py", "test_x", "tests/a/b.py::test_x"),
        (1, "tests/a/b.py", "test_y", "::test_y"),
        (1, None, "test_z", "test_c.py::test_z"),
        (2, "tests/a/", None, "tests/a/"),
    ]


def test_a_missing_file_or_test_is_named_with_its_line():
    text = ("`tests/test_docs_references.py::test_every_test_the_docs_name_exists`, "
            "`::no_such_test`\n"
            "`tests/no_such_file.py::test_x` and `test_docs_references.py::gone`")
    assert problems_in(text, "doc.md") == [
        "doc.md:1: ::no_such_test: tests/test_docs_references.py defines no no_such_test",
        "doc.md:2: tests/no_such_file.py::test_x: tests/no_such_file.py does not exist",
        "doc.md:2: test_docs_references.py::gone: no gone in tests/test_docs_references.py",
    ]


def test_every_test_the_docs_name_exists():
    assert len(DOCS) > 10
    named = sum(
        1
        for doc in DOCS
        for _, _, name, _ in references_in(doc.read_text(encoding="utf-8"))
        if name
    )
    assert named > 40  # the docs name some fifty tests: fewer read means the pattern broke
    problems = [
        problem
        for doc in DOCS
        for problem in problems_in(doc.read_text(encoding="utf-8"), str(doc.relative_to(ROOT)))
    ]
    assert not problems, "\n".join(problems)
