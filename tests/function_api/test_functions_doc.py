"""docs/functions.md against the code: every public parameter of forge.function, LLM.generate,
LLM.chat and LLM.embed is in its table with its default, every field of Generation is listed, every
bound quoted with a constant name equals that constant, and the bounds the tables state are the ones
GenerateParams enforces."""
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import forge
from forge import constants
from forge.errors import RequestRejected
from forge.functions.api import LLM, Generation, GenerateParams
from forge.functions.llm import NodeLLM

DOC = (Path(__file__).resolve().parents[2] / "docs" / "functions.md").read_text()


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert m, f"docs/functions.md has no section '## {title}'"
    return m.group(1)


def _table(title: str) -> dict[str, list[str]]:
    """First column (a `name`) -> the other cells, for the table rows of a section."""
    rows = {}
    for line in _section(title).splitlines():
        m = re.match(r"^\| `([a-z_]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def _params(fn) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(fn).parameters.items() if n not in ("self", "fn")}


def _shown(p: inspect.Parameter) -> str:
    return "required" if p.default is inspect.Parameter.empty else f"`{p.default!r}`"


@pytest.mark.parametrize(
    "title, fn",
    [
        ("`@forge.function`", forge.function),
        ("`llm.generate`", LLM.generate),
        ("`llm.chat`", LLM.chat),
        ("`llm.embed`", LLM.embed),
    ],
)
def test_every_parameter_is_documented_with_its_default(title, fn):
    table = _table(title)
    params = _params(fn)
    assert set(table) == set(params), f"{title}: doc {sorted(table)} vs code {sorted(params)}"
    for name, p in params.items():
        assert table[name][0] == _shown(p), (
            f"{title} {name}: doc says {table[name][0]}, code {_shown(p)}"
        )


def test_the_handle_jobs_get_takes_what_the_interface_declares():
    for name in ("generate", "chat", "embed"):
        assert _params(getattr(NodeLLM, name)).keys() == _params(getattr(LLM, name)).keys(), name


def test_generation_fields_are_listed():
    assert set(_table("`Generation`")) == {f.name for f in dataclasses.fields(Generation)}


def test_every_quoted_constant_has_its_value():
    quoted = re.findall(r"([0-9][0-9.*,]*(?: - 1)?)\]?(?: [a-z]+)? \(`([A-Z0-9_]+)`\)", DOC)
    assert {name for _, name in quoted} >= {
        "INT32_MAX",
        "MIN_SAMPLING_TEMPERATURE",
        "MAX_SAMPLING_TEMPERATURE",
        "MAX_GUIDE_CHOICES",
        "MAX_GUIDE_BYTES",
        "MAX_STOP_STRINGS",
        "MAX_STOP_CHARS",
        "MAX_CHAT_MESSAGES",
    }, quoted
    for value, name in quoted:
        assert hasattr(constants, name), name
        assert eval(value.replace(",", "")) == getattr(constants, name), f"{value} ({name})"  # noqa: S307 - the doc's own numbers


# The bounds the generate table states, at their edges: inside is taken, just outside is refused by
# GenerateParams.
EDGES = [
    ("max_tokens", 1, 0), ("max_tokens", constants.INT32_MAX, constants.INT32_MAX + 1),
    ("temperature", constants.MIN_SAMPLING_TEMPERATURE, 0.005),
    ("temperature", constants.MAX_SAMPLING_TEMPERATURE, constants.MAX_SAMPLING_TEMPERATURE * 1.01),
    ("top_p", 1.0, 0.0), ("top_k", 0, -1), ("top_k", constants.INT32_MAX, constants.INT32_MAX + 1),
    ("seed", 2**63 - 1, 2**63),
    ("stop", ("x",) * constants.MAX_STOP_STRINGS, ("x",) * (constants.MAX_STOP_STRINGS + 1)),
    ("stop", ("x" * constants.MAX_STOP_CHARS,), ("x" * (constants.MAX_STOP_CHARS + 1),)),
    ("choice", ("a",) * constants.MAX_GUIDE_CHOICES, ("a",) * (constants.MAX_GUIDE_CHOICES + 1)),
]


@pytest.mark.parametrize("name, inside, outside", EDGES)
def test_the_documented_bounds_are_enforced(name, inside, outside):
    base = {"max_tokens": 8}
    GenerateParams(**{**base, name: inside})
    with pytest.raises(RequestRejected, match=name.split("_")[0]):
        GenerateParams(**{**base, name: outside})


def test_stop_is_refused_with_a_guide_as_the_doc_says():
    with pytest.raises(RequestRejected, match="stop strings do not apply to guided output"):
        GenerateParams(max_tokens=8, choice=("a", "b"), stop=("x",))


def test_the_exceptions_named_exist():
    import forge.errors as errors

    for name in re.findall(r"^\| `([A-Za-z]+)` \|", _section("What raises what"), re.M):
        assert isinstance(getattr(errors, name, None), type), name
