"""Walking a JSON schema's subschemas and following its local `$ref`s (JSON pointers into itself).

`walk(schema)` lists every subschema once, iteratively (no Python recursion, whatever the depth),
with its JSON pointer and how many data levels (properties, items, ...) lie above it. `resolve`
turns a local `$ref` (`#`, `#/$defs/Name`, `#/properties/a/items`) into that pointer; anchors,
`$id`s and other documents are left to the grammar compiler, which refuses what it cannot load.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import unquote

# keyword -> (how it holds subschemas, whether the values it describes sit one data level down)
_MAPS = {"properties": True, "patternProperties": True, "dependentSchemas": False, "$defs": False,
         "definitions": False}
_ONE = {"additionalProperties": True, "items": True, "additionalItems": True, "unevaluatedProperties": True,
        "unevaluatedItems": True, "contains": True, "propertyNames": False, "not": False, "if": False,
        "then": False, "else": False}
_LISTS = {"anyOf": False, "allOf": False, "oneOf": False, "prefixItems": True, "items": True}
DEFINITIONS = ("$defs", "definitions")
NOT_GENERATED = ("not", "if", "then", "else", "propertyNames", *DEFINITIONS)  # reached by no value written


@dataclass(frozen=True)
class Child:
    keyword: str
    tokens: tuple[str, ...]  # pointer tokens below the parent: ("properties", "a") or ("anyOf", "0")
    schema: Any  # a dict, or a boolean schema
    deeper: bool  # the values it describes are one data level below the parent's


@dataclass(frozen=True)
class Node:
    pointer: str  # JSON pointer from the root ("" for the root)
    schema: Any
    level: int  # data levels above it (the root's properties are at level 1)


def children(schema: Any) -> Iterator[Child]:
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        if key in _MAPS and isinstance(value, dict):
            for name, sub in value.items():
                if isinstance(sub, (dict, bool)):
                    yield Child(key, (key, str(name)), sub, _MAPS[key])
        elif key in _ONE and isinstance(value, (dict, bool)):
            yield Child(key, (key,), value, _ONE[key])
        elif key in _LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                if isinstance(sub, (dict, bool)):
                    yield Child(key, (key, str(i)), sub, _LISTS[key])


def escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def walk(schema: Any) -> list[Node]:
    """Every subschema, the root first. A definition starts over at level 0 (refs reach it from anywhere)."""
    out: list[Node] = []
    stack = [Node("", schema, 0)]
    while stack:
        node = stack.pop()
        out.append(node)
        for child in children(node.schema):
            pointer = node.pointer + "".join("/" + escape(t) for t in child.tokens)
            level = 0 if child.keyword in DEFINITIONS else node.level + child.deeper
            stack.append(Node(pointer, child.schema, level))
    return out


def resolve(ref: Any) -> str | None:
    """The JSON pointer a local `$ref` names, or None for anything else."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    return pointer if pointer == "" or pointer.startswith("/") else None
