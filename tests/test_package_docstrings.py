"""A package's docstring (forge/**/__init__.py, bench/forge_bench/**/__init__.py) names only files
that exist: the map a newcomer reads first must not send them to a file that moved away
(forge/runtime's once described admission.py, driver.py, ... of host/).

Checked: a path from the repository's root (`forge/cluster/actor.py`, `docs/broker.md`,
`forge/node`), and a bare file or folder name (`mapping.py`, `local.yaml`, `tiny-llama/`), which is
the package's own (in it or below it). A module named without its extension (`plots`) is prose, not
checked.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILE_TYPES = ("py", "yaml", "yml", "md", "toml")
FROM_ROOT = re.compile(r"(?<![\w./-])(?:forge|docs)/[\w./-]*\w/?")
BARE = re.compile(rf"(?<![\w./-])[\w-]+(?:\.(?:{'|'.join(FILE_TYPES)})|/)(?![\w/-])")
# forge's packages and forge-bench's (bench/forge_bench, a distribution of its own beside forge)
PACKAGES = sorted(p.parent for top in (ROOT / "forge", ROOT / "bench" / "forge_bench")
                  for p in top.rglob("__init__.py"))


def named_files(docstring: str) -> tuple[list[str], list[str]]:
    """(paths from the repository's root, bare names) that `docstring` names."""
    from_root = FROM_ROOT.findall(docstring)
    return from_root, BARE.findall(FROM_ROOT.sub(" ", docstring))


def missing(package: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    from_root, bare = named_files(doc)
    gone = [p for p in from_root if not (ROOT / p).exists()]
    own = {p.relative_to(package).as_posix() for p in package.rglob("*")} | {
        p.name for p in package.rglob("*")
    }
    return gone + [name for name in bare if name.rstrip("/") not in own]


def test_the_names_found_are_the_file_like_ones():
    from_root, bare = named_files("driver.py (forge/cluster/actor.py) and tiny-llama/, see "
                                  "docs/x.md and forge/node; "
                                  "`forge run --openai-batch IN.jsonl`, forge[ray], `plots`, e.g. "
                                  "a.b.")
    assert from_root == ["forge/cluster/actor.py", "docs/x.md", "forge/node"]
    assert bare == ["driver.py", "tiny-llama/"]


@pytest.mark.parametrize(
    "package", PACKAGES, ids=[p.relative_to(ROOT).as_posix() for p in PACKAGES]
)
def test_a_package_docstring_names_only_files_that_exist(package):
    assert missing(package) == [], (
        f"{package.relative_to(ROOT)}/__init__.py names files it does not have"
    )
