"""Function files that fail to import, refuse to load, or raise: one clear line (import) or one
error row per record (call), never a traceback, never a lost record. Function files are trusted user
code that runs as you: these tests cover mistakes, not malice (os._exit or an endless loop at import
cannot be contained)."""
from __future__ import annotations

import builtins
import hashlib
import json
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from forge.errors import ForgeError
from forge.functions.loader import load_function
from forge.functions.runner import error_row
from forge.records.writer import encode_error, encode_result
from forge.constants import EXIT_ERROR_ROWS
from tests.reliability._rel import (
    FUNCTIONS,
    NODES,
    assert_complete,
    assert_no_traceback,
    forge,
    read_rows,
    record_figures,
)

FUZZ = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True)
HEADER = "import forge\nimport sys\n"
GOOD = "@forge.function(max_output_tokens=8)\nasync def f(record, llm):\n    return record\n"
BUILTIN_EXCEPTIONS = sorted((v for v in vars(builtins).values() if isinstance(v, type)
                             and issubclass(v, BaseException) and v is not KeyboardInterrupt),
                            key=lambda c: c.__name__)

sources = st.one_of(
    # an exception at import, of every built-in kind, with any message
    st.builds(lambda exc, msg: HEADER + f"raise {exc.__name__}({msg!r})\n" + GOOD,
              st.sampled_from(BUILTIN_EXCEPTIONS), st.text(max_size=200)),
    st.builds(lambda code: HEADER + f"sys.exit({code!r})\n" + GOOD,
              st.one_of(st.none(), st.integers(-3, 300), st.text(max_size=20))),
    st.just(HEADER + "def down(n):\n    return down(n + 1)\ndown(0)\n" + GOOD),
    st.just(HEADER + "import forge_no_such_module_x\n" + GOOD),
    # decorator misuse
    st.just(HEADER + "@forge.function\ndef f(record, llm):\n    return record\n"),
    st.just(HEADER + "@forge.function\nasync def f(record):\n    return record\n"),
    st.builds(lambda n: HEADER + f"@forge.function(max_output_tokens={n!r})\nasync def f(record, "
                                 "llm):\n    return 1\n",
              st.one_of(st.integers(-5, 0), st.text(max_size=3))),
    st.builds(lambda n: HEADER + f"@forge.function(concurrency={n!r})\nasync def f(record, "
                                 "llm):\n    return 1\n",
              st.one_of(st.integers(-5, 0), st.just(True), st.just(2.5), st.just("8"))),
    # nothing to run, or too much
    st.just(HEADER),
    st.just(HEADER + GOOD + GOOD.replace("def f", "def g")),
    # an object whose attribute lookup raises, next to a good function
    st.just(HEADER + "class Lazy:\n    def __getattr__(self, name):\n        raise "
                     "ImportError(name)\n"
            "lazy = Lazy()\n" + GOOD),
    # not Python at all: random text and random bytes
    st.text(alphabet=string.printable, max_size=300),
    st.text(max_size=120),
    st.binary(max_size=200),
    # a valid file
    st.just(HEADER + GOOD),
)


@pytest.mark.timeout(300)
@settings(max_examples=300, derandomize=True, **FUZZ)
@given(source=sources, named=st.booleans())
def test_function_files_load_or_are_refused_with_one_line(tmp_path_factory, source, named):
    raw = source if isinstance(source, bytes) else source.encode("utf-8", "surrogatepass")
    path = tmp_path_factory.getbasetemp() / f"fn_{hashlib.sha1(raw).hexdigest()[:16]}.py"
    path.write_bytes(raw)
    target = f"{path}:f" if named else str(path)
    try:
        spec = load_function(target)
    except ForgeError as e:
        message = str(e)
        assert len(message.splitlines()) == 1, message
        assert str(path) in message and len(message) < 2000, message
        STATS["refused"] += 1
    else:
        assert spec.name == "f" and spec.fn.__code__.co_filename == str(path)
        STATS["loaded"] += 1


STATS = {"loaded": 0, "refused": 0, "rows": 0}


class _Weird(Exception):
    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        if self.text == "raise":
            raise ValueError("no")
        return self.text


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(),
        st.text(st.characters(codec=None, exclude_categories=()), max_size=10),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
odd_values = st.one_of(
    json_values,
    st.builds(set, st.lists(st.integers(), max_size=3)),
    st.binary(max_size=8),
    st.just(10**5000),
    st.just(object()),
    st.builds(lambda: float("nan")),
)


@settings(max_examples=400, derandomize=True, **FUZZ)
@given(
    index=st.integers(0, 2**40),
    exc=st.sampled_from(BUILTIN_EXCEPTIONS + [_Weird]),
    text=st.one_of(
        st.text(max_size=50),
        st.text(st.characters(codec=None, exclude_categories=()), max_size=50),
        st.just("raise"),
        st.just("x" * 20000),
    ),
    value=odd_values,
)
def test_any_exception_or_return_value_becomes_one_valid_output_row(index, exc, text, value):
    """What the runner writes for a record whose function raised `exc(text)` or returned `value`:
    always one line of strict JSON with the index, whatever the exception's message or the value
    is."""
    err = None
    for args in ((text,), ()):
        try:
            err = exc(*args)
            break
        except Exception:  # noqa: BLE001 - a built-in that wants other arguments (exception groups, ...)
            continue
    err = err if err is not None else RuntimeError(text)
    row = error_row(index, err)["error"]
    for line in (encode_error(index, row["type"], row["message"]), encode_result(index, value)[0]):
        assert "\n" not in line and "\r" not in line
        parsed = json.loads(line)
        assert parsed["index"] == index and set(parsed) in ({"index", "result"}, {"index", "error"})
        line.encode("utf-8")                  # writable as UTF-8 (no lone surrogates)
        # nor escaped ones: strict text once parsed
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
        STATS["rows"] += 1


CASES = [
    "ok",
    "value",
    "multiline",
    "huge",
    "surrogate",
    "unprintable",
    "no_message",
    "system_exit",
    "keyboard",
    "generator_exit",
    "stop_iteration",
    "custom_base",
    "recursion",
    "memory",
    "timeout",
    "unicode",
    "recurse",
    "bad_generate",
    "nan_temperature",
    "too_long_prompt",
    "set",
    "nan",
    "inf",
    "object",
    "surrogate_result",
    "cycle",
    "bigint",
    "bytes",
    "none",
    "deep",
]
EXPECTED_TYPE = {
    "value": "ValueError",
    "multiline": "RuntimeError",
    "huge": "ValueError",
    "surrogate": "ValueError",
    "unprintable": "Unprintable",
    "no_message": "KeyError",
    "system_exit": "SystemExit",
    "keyboard": "KeyboardInterrupt",
    "generator_exit": "GeneratorExit",
    "stop_iteration": "RuntimeError",
    "custom_base": "Custom",
    "recursion": "RecursionError",
    "memory": "MemoryError",
    "timeout": "TimeoutError",
    "unicode": "UnicodeDecodeError",
    "recurse": "RecursionError",
    "bad_generate": "RequestRejected",
    "nan_temperature": "RequestRejected",
    "too_long_prompt": "RequestRejected",
    "set": "SerializationError",
    "nan": "SerializationError",
    "inf": "SerializationError",
    "object": "SerializationError",
    "surrogate_result": "SerializationError",
    "cycle": "SerializationError",
    "bigint": "SerializationError",
    "bytes": "SerializationError",
    "deep": "SerializationError",
}


@pytest.mark.timeout(120)
def test_a_function_failing_every_way_fails_only_its_records(tmp_path):
    n = 3 * len(CASES)
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        "".join(json.dumps({"i": i, "case": CASES[i % len(CASES)]}) + "\n" for i in range(n))
    )
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        FUNCTIONS / "raises.py",
        "--node",
        NODES / "instant.yaml",
        "--input",
        inp,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
    )
    # complete; every failing record is an error row
    assert r.returncode == EXIT_ERROR_ROWS, r.stderr
    assert_no_traceback(r.stderr)
    assert_complete(out, out.with_name(out.name + ".ledger.sqlite"), n)
    for row in read_rows(out):
        case = CASES[row["index"] % len(CASES)]
        if case in EXPECTED_TYPE:
            assert row["error"]["type"] == EXPECTED_TYPE[case], (case, row)
            assert len(row["error"]["message"]) <= 8300
        else:
            assert "result" in row, (case, row)
    record_figures(
        "fuzz-functions",
        import_cases_loaded=STATS["loaded"],
        import_cases_refused=STATS["refused"],
        rows_encoded=STATS["rows"],
        call_failure_kinds=len(EXPECTED_TYPE),
        records=n,
    )


def test_function_file_import_failures_through_the_cli(tmp_path):
    """The same refusals as the user sees them: exit code, one line, no traceback."""
    files = {
        "exits.py": HEADER + "sys.exit(3)\n" + GOOD,
        "raises.py": HEADER + "raise ValueError('no\\nway')\n" + GOOD,
        "syntax.py": "def (:\n",
        "empty.py": "",
        "binary.py": b"\x00\xff\xfe",
    }
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"a": 1}\n')
    for name, body in files.items():
        path = tmp_path / name
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
        r = forge(
            "run",
            path,
            "--node",
            NODES / "instant.yaml",
            "--input",
            inp,
            "--output",
            tmp_path / f"{name}.out",
        )
        assert r.returncode in (1, 2), (name, r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0], (name, r.stderr)
        assert_no_traceback(r.stderr)
