"""Turning jsonschema and pydantic errors into one-line findings at exact JSON paths, worded for
the person who wrote the YAML (with "did you mean" for unknown keys and values)."""
from __future__ import annotations

import difflib
import re
from typing import Iterable, Sequence

import jsonschema
import pydantic

# Patterns of the models, said in words.
PATTERN_WORDS = {
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$": "a name: letters, digits, '.', '_' or '-', starting with a "
                                     "letter or digit",
    r"^[0-9]{1,2}\.[0-9]$": 'a compute capability such as "12.0" (major.minor)',
    r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGT]i?B|B)?\s*$": 'a size: a number of bytes, or a string such as '
                                                   '"8GiB"',
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an environment variable name",
}
# Why a missing key is never filled in for you.
MISSING_WHY = {
    "limits": "the token geometry has no default; forge never leaves it to an engine",
    "kv_cache": "cache sizing has no default; forge never leaves it to an engine",
}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def json_path(parts: Iterable) -> str:
    out = "$"
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _IDENT.match(str(p)):
            out += f".{p}"
        else:
            out += "[" + repr(str(p)) + "]"
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    choices = sorted(set(choices))
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (expected one of: {', '.join(choices)})" if 0 < len(choices) <= 12 else ""


def describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _types(t) -> str:
    names = t if isinstance(t, list) else [t]
    return " or ".join(_TYPE_WORDS.get(n, n) for n in names)


def _branches(err: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """For anyOf/oneOf: the errors of branches whose type matched (they say what is really wrong)."""
    return [e for e in err.context if not (e.validator == "type" and not e.relative_path)]


def _schema_messages(err: jsonschema.ValidationError) -> list[tuple[tuple, str]]:
    """(path parts, message) pairs for one jsonschema error."""
    path, v, inst, val = tuple(err.absolute_path), err.validator, err.instance, err.validator_value
    if v == "additionalProperties" and isinstance(inst, dict):
        allowed = list(err.schema.get("properties", {}))
        return [
            (path + (k,), f"unknown key {k!r}{did_you_mean(k, allowed)}")
            for k in inst
            if k not in allowed
        ]
    if v == "required" and isinstance(inst, dict):
        why = MISSING_WHY.get(str(path[-1]) if path else "", "")
        return [
            (path + (k,), "missing required key" + (f" ({why})" if why else ""))
            for k in val
            if k not in inst
        ]
    if v == "type":
        return [(path, f"expected {_types(val)}, got {describe(inst)}")]
    if v in ("anyOf", "oneOf"):
        typed = _branches(err)
        if typed:
            out = []
            for sub in typed:
                out.extend(_schema_messages(sub))
            return out
        wanted = sorted(
            {
                t
                for e in err.context
                for t in (
                    e.validator_value
                    if isinstance(e.validator_value, list)
                    else [e.validator_value]
                )
                if t != "null"
            }
        )
        return [(path, f"expected {_types(wanted)}, got {describe(inst)}")]
    if v in ("enum", "const"):
        choices = [str(c) for c in (val if v == "enum" else [val])]
        # described, never quoted: an alias bomb quoted is megabytes
        if isinstance(inst, (dict, list)):
            listed = f" (expected one of: {', '.join(choices)})" if 0 < len(choices) <= 12 else ""
            return [(path, f"unknown value: got {describe(inst)}{listed}")]
        shown = repr(inst) if len(repr(inst)) <= 80 else repr(inst)[:77] + "..."
        return [(path, f"unknown value {shown}{did_you_mean(str(inst)[:200], choices)}")]
    if v == "minimum":
        return [(path, f"must be at least {val}, got {inst}")]
    if v == "exclusiveMinimum":
        return [(path, f"must be greater than {val}, got {inst}")]
    if v == "maximum":
        return [(path, f"must be at most {val}, got {inst}")]
    if v == "exclusiveMaximum":
        return [(path, f"must be less than {val}, got {inst}")]
    if v == "minLength":
        return [(path, "must not be empty" if val == 1 else f"must be at least {val} characters")]
    if v == "maxLength":
        return [(path, f"must be at most {val} characters")]
    if v == "minItems":
        return [(path, f"needs at least {val} item{'s' if val != 1 else ''}")]
    if v == "pattern":
        return [(path, f"{describe(inst)} is not "
                       f"{PATTERN_WORDS.get(val, 'in the form ' + repr(val))}")]
    return [(path, err.message)]


def schema_findings(validator: jsonschema.Validator, data) -> list[tuple[str, str]]:
    """(json path, message) for every schema error in `data`, deduplicated, in document order."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for err in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        for parts, msg in _schema_messages(err):
            item = (json_path(parts), msg)
            if item not in seen:
                seen.add(item)
                out.append(item)
    return out


def pydantic_findings(err: pydantic.ValidationError, prefix: Sequence = (),
                      only_value_errors: bool = False) -> list[tuple[str, str]]:
    """(json path, message) for a pydantic error; model-level rules land on the model's own path."""
    out = []
    for e in err.errors(include_url=False):
        if only_value_errors and e["type"] not in ("value_error", "assertion_error"):
            continue
        ctx_err = (e.get("ctx") or {}).get("error")
        msg = str(ctx_err) if ctx_err is not None else e["msg"]
        out.append((json_path(tuple(prefix) + tuple(e["loc"])), msg))
    return out
