"""Values a user must state before a file is used: `forge contract new` writes them into the node it
drafts (the host's memory and cores, a GPU's NVML name), each a string beginning with FILL IN:.
Validation refuses each one by name, with what it asks for, instead of a type error about a string
where a number belongs."""
from __future__ import annotations

from forge.config.messages import json_path

PREFIX = "FILL IN:"


def placeholder(what: str) -> str:
    """The value written where the user must state `what`."""
    return f"{PREFIX} {what}"


def find_placeholders(data) -> list[tuple[str, str]]:
    """(JSON path, what it asks for) for every placeholder in a parsed YAML document, in document
    order."""
    found: list[tuple[str, str]] = []

    def walk(value, parts: tuple) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, parts + (k,))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, parts + (i,))
        elif isinstance(value, str) and value.startswith(PREFIX):
            found.append((json_path(parts), value[len(PREFIX):].strip()))

    walk(data, ())
    return found


def placeholder_message(asks: str) -> str:
    return ("not filled in yet: `forge contract new` left a placeholder here for you to state "
            f"{asks}")
