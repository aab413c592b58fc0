"""YAML for untrusted files: safe tags only, bounded depth, bounded alias expansion, no cycles.

PyYAML shares aliased nodes, so an alias bomb costs nothing to parse and everything to walk later
(validation, printing). We therefore measure the *expanded* document before constructing it."""
from __future__ import annotations

import sys

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from forge import constants

# Nodes in the fully expanded document. A 1 MiB file without aliases stays far below this.
MAX_EXPANDED_NODES = 200_000


class YamlRefused(Exception):
    """The text is not YAML we accept; the message is one line for the user."""


def _where(mark) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts aliases and depth while composing, and refuses duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > constants.MAX_YAML_ALIASES:
                raise YamlRefused(f"more than {constants.MAX_YAML_ALIASES} YAML aliases"
                                  f"{_where(self.peek_event().start_mark)}")
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > constants.MAX_CONFIG_DEPTH:
                raise YamlRefused(f"nested deeper than {constants.MAX_CONFIG_DEPTH} levels"
                                  f"{_where(self.peek_event().start_mark)}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        # PyYAML keeps the last of two equal keys silently; a user file must not say two things.
        seen: set = set()
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise YamlRefused("duplicate key "
                                      f"{key_node.value!r}{_where(key_node.start_mark)}")
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)


# JSON Schema (and our formats) want strings, not datetime objects (as check-jsonschema does).
BoundedLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node)
)


def _measure(root) -> None:
    """Expanded size and depth of the node graph; refuses cycles (`&a [*a]`) and bombs."""
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def walk(node) -> tuple[int, int]:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise YamlRefused(f"recursive YAML alias{_where(node.start_mark)}")
        active.add(key)
        size, depth = 1, 0
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        for child in children:
            s, d = walk(child)
            size += s
            depth = max(depth, d)
            if size > MAX_EXPANDED_NODES:
                raise YamlRefused(f"expands to more than {MAX_EXPANDED_NODES} values (alias bomb?)")
        depth += 1
        if depth > constants.MAX_CONFIG_DEPTH:
            raise YamlRefused(f"nested deeper than {constants.MAX_CONFIG_DEPTH} levels once "
                              "aliases are expanded")
        active.discard(key)
        memo[key] = (size, depth)
        return size, depth

    walk(root)


def load_yaml(text: str):
    """One YAML document from text, as plain Python data; raises YamlRefused with a one-line
    reason."""
    loader = None
    try:
        loader = BoundedLoader(text)  # the reader checks every character here (control characters)
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node)
        return loader.construct_document(node)
    except YamlRefused:
        raise
    except yaml.reader.ReaderError as e:      # raised before any mark exists: say where ourselves
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        char = e.character if isinstance(e.character, str) else chr(e.character)
        raise YamlRefused(f"character U+{ord(char):04X} is not allowed in YAML (line {line}, "
                          f"column {column})") \
            from None
    except yaml.MarkedYAMLError as e:
        parts = [x.strip() for x in (e.context, e.problem) if x]
        problem = (", " if len(parts) == 2 and parts[1].startswith("but") else ": ").join(
            parts
        ) or "invalid YAML"
        raise YamlRefused(
            f"YAML syntax error: {problem}{_where(e.problem_mark or e.context_mark)}"
        ) from None
    except yaml.YAMLError as e:
        raise YamlRefused(f"YAML error: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise YamlRefused("YAML structure too deep") from None
    # an integer of more digits than Python converts (sys.get_int_max_str_digits)
    except ValueError as e:
        if "integer string conversion" in str(e):
            raise YamlRefused(
                f"a number with more than {sys.get_int_max_str_digits()} digits"
            ) from None
        raise YamlRefused(f"YAML value not readable: {' '.join(str(e).split())[:160]}") from None
    finally:
        if loader is not None:
            loader.dispose()
