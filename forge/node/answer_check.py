"""A remote node's answer to one request, checked once where it is parsed (forge/node/remote.py):
what reaches a function is a Generation whose every field has its type and range, or that request's
error.

A node is another process, perhaps of another forge, perhaps not forge at all: `text: ["x"]`,
`output_tokens: -5`, `token_ids: "abc"` or a NaN count reached the function as they came. Each is
now that request's ForgeError (an error row, the run goes on), naming the node and the field; a
well-formed error from the node is raised as its own type, as before."""
from __future__ import annotations

import math
from typing import Any, Optional

from forge.errors import ForgeError, NodeDown, RequestRejected
from forge.requests import Generation

MAX_COUNT = 2**31 - 1          # tokens in one request: no engine counts past int32
MAX_TOKEN_ID = 2**31 - 1
MAX_FIELD_CHARS = 256          # finish_reason, card, an error's type
MAX_STOP_CHARS = 4096          # a stop string a request may name
ERROR_TYPES = {"RequestRejected": RequestRejected, "NodeDown": NodeDown}


class BadAnswer(ForgeError):
    """A node's answer to one request that forge cannot use: that request's error."""


def _count(out: dict, key: str, node: str) -> int:
    value = out.get(key)
    # bool, float (NaN, 1e400) and str refused
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise BadAnswer(f"node {node} answered a request with {key} = {_shown(value)}: not a count "
                        "of tokens "
                        f"(an integer from 0 to {MAX_COUNT})")
    return value


def _short_text(out: dict, key: str, node: str, default: Optional[str] = None) -> str:
    value = out.get(key, default)
    if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
        raise BadAnswer(f"node {node} answered a request with {key} = {_shown(value)}: not a short "
                        "string")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _finite_numbers(value: Any, depth: int = 0) -> bool:
    if isinstance(value, list) and depth < 2:
        return all(_finite_numbers(v, depth + 1) for v in value)
    return type(value) in (int, float) and math.isfinite(value) and depth > 0


def raise_if_error(out: Any, node: str) -> None:
    """An answer that is no object, or the node's error for this request: raised (the error as its
    own type)."""
    if not isinstance(out, dict):
        raise BadAnswer(f"node {node} answered a request with {_shown(out)}: not an object")
    if "error" not in out:
        return
    err = out["error"]
    if not isinstance(err, dict) or not isinstance(err.get("message", ""), str):
        raise BadAnswer(f"node {node} answered a request with error = {_shown(err)}: not an error "
                        "forge can read")
    cls = ERROR_TYPES.get(err.get("type"), ForgeError)
    raise cls(err.get("message") or f"node {node}: error")


def generation_of(out: Any, node: str) -> Generation:
    """The Generation a node's answer describes, every field checked (forge/node/endpoint.py writes
    them)."""
    raise_if_error(out, node)
    text = out.get("text")
    if not isinstance(text, str):
        raise BadAnswer(f"node {node} answered a request with text = {_shown(text)}: not a string")
    ids = out.get("token_ids")          # a node of an older forge sends none
    if ids is None:
        ids = []
    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in ids):
        raise BadAnswer(f"node {node} answered a request with token_ids = {_shown(ids)}: not a "
                        "list of token ids")
    output_tokens = _count(out, "output_tokens", node)
    if len(ids) > output_tokens:
        raise BadAnswer(f"node {node} answered a request with {len(ids)} token_ids but "
                        "output_tokens = "
                        f"{output_tokens}")
    return Generation(
        text=text,
        output_tokens=output_tokens,
        input_tokens=_count(out, "input_tokens", node),
        finish_reason=_short_text(out, "finish_reason", node),
        card=_short_text(out, "card", node, ""),
        token_ids=tuple(ids),
    )


def hidden_of(out: dict, node: str) -> Optional[list]:
    """The hidden state an embed request asked for: absent, or a list of finite numbers (or of lists
    of them)."""
    hidden = out.get("hidden")
    if hidden is not None and not (isinstance(hidden, list) and _finite_numbers(hidden)):
        raise BadAnswer(f"node {node} answered a request with hidden = {_shown(hidden)}: not a "
                        "list of finite "
                        "numbers")
    return hidden


def stop_reason_of(out: dict, node: str) -> Optional[str]:
    """The stop string that cut the text (forge/node/endpoint.py), or None."""
    value = out.get("stop_reason")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_STOP_CHARS:
        raise BadAnswer(f"node {node} answered a request with stop_reason = {_shown(value)}: not a "
                        "stop string")
    return value
