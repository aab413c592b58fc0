"""A guided request's JSON Schema checked at the node's edge, so a client's mistake is refused (400)
up front instead of failing inside an engine (500) or recursing without end in the result check:

- it must be a valid JSON Schema (its draft's metaschema);
- it must admit a value at all: a subschema every value must satisfy that admits nothing (`false`,
  `{"not": {}}`, `{"not": true}`, `{"enum": []}`) is refused instead of coming back as a failed
  check;
- it must admit a finite value: no cycle of references that every value must follow. `{"$ref":
  "#"}`, or an object whose required property refers back to it, has no finite instance. Only edges
  every instance must take are followed ($ref, allOf, required properties, items of a non-empty
  array, one-member anyOf/oneOf), so a schema that can stop recursing (an optional property, an
  anyOf with a way out) is left alone.

Results are cached (bounded): a bulk job sends the same schema with every record."""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Iterator, Optional
from urllib.parse import unquote

CACHE_ENTRIES = 256
_cache: OrderedDict[str, Optional[str]] = OrderedDict()


def schema_problem(schema: Any) -> Optional[str]:
    """Why `schema` cannot guide a request, or None."""
    if not isinstance(schema, dict):
        return "json_schema must be a JSON object"
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as e:
        return f"json_schema is not JSON: {e}"
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    problem = _metaschema_problem(schema) or _forced_walk(schema)
    _cache[key] = problem
    if len(_cache) > CACHE_ENTRIES:
        _cache.popitem(last=False)
    return problem


def _metaschema_problem(schema: dict) -> Optional[str]:
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        return f"json_schema is not a valid JSON Schema: {e.message}" + (
            f" (at #/{where})" if where else ""
        )
    except RecursionError:
        return "json_schema is nested too deeply"
    return None


def _resolve(root: dict, ref: str) -> Optional[tuple[str, Any]]:
    """A local reference ('#' or '#/a/b') to (its pointer, its schema); None for anything else."""
    if ref == "#":
        return "#", root
    if not ref.startswith("#/"):
        return None
    here: Any = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(here, dict) and part in here:
            here = here[part]
        elif isinstance(here, list) and part.isdigit() and int(part) < len(here):
            here = here[int(part)]
        else:
            return None
    return ref, here


def _forced(root: dict, at: str, sub_schema: Any) -> Iterator[tuple[str, Any, str]]:
    """(pointer, schema, how) for each subschema every instance of `sub_schema` must also
    satisfy."""
    if not isinstance(sub_schema, dict):
        return
    if isinstance(sub_schema.get("$ref"), str):
        target = _resolve(root, sub_schema["$ref"])
        if target is not None:
            yield target[0], target[1], f"$ref {sub_schema['$ref']}"
    for key in ("allOf", "anyOf", "oneOf"):
        members = sub_schema.get(key)
        if isinstance(members, list) and (key == "allOf" or len(members) == 1):
            for i, sub in enumerate(members):
                yield f"{at}/{key}/{i}", sub, key
    props, required = sub_schema.get("properties"), sub_schema.get("required")
    if isinstance(props, dict) and isinstance(required, list):
        for name in required:
            if isinstance(name, str) and name in props:
                yield f"{at}/properties/{name}", props[name], f"required property {name!r}"
    min_items = sub_schema.get("minItems", 0)
    if isinstance(min_items, int) and min_items >= 1:
        prefix = sub_schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            for i, sub in enumerate(prefix[:min_items]):
                yield f"{at}/prefixItems/{i}", sub, "a required array item"
        elif isinstance(sub_schema.get("items"), dict):
            yield f"{at}/items", sub_schema["items"], "a required array item"


def _admits_nothing(sub_schema: Any) -> bool:
    if sub_schema is False:
        return True
    if not isinstance(sub_schema, dict):
        return False
    negated = sub_schema.get("not")
    return negated is True or negated == {} or sub_schema.get("enum") == []


def _forced_walk(root: dict) -> Optional[str]:
    """The first subschema every value must satisfy that admits nothing, or a cycle of them that
    nests forever."""
    on_path: list[str] = []
    done: set[str] = set()

    def visit(at: str, sub_schema: Any, how: str) -> Optional[str]:
        if _admits_nothing(sub_schema):
            return (f"json_schema admits no value: {at} (via {how}) is "
                    f"{json.dumps(sub_schema)[:80]}, which nothing "
                    "satisfies")
        if at in on_path:
            loop = on_path[on_path.index(at):] + [at]
            return (f"json_schema has no finite value: {' -> '.join(loop)} (via {how}) must nest "
                    "forever; "
                    f"make one step optional")
        if at in done or len(on_path) > 200:
            return None
        on_path.append(at)
        for sub_at, sub, sub_how in _forced(root, at, sub_schema):
            problem = visit(sub_at, sub, sub_how)
            if problem:
                return problem
        on_path.pop()
        done.add(at)
        return None

    return visit("#", root, "the root")
