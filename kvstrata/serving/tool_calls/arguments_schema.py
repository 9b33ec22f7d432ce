"""A tool's parameters schema made fit to sit inside a forced call's schema (constraints.py).

The call schema nests the parameters under `arguments`, so references written against the
parameters' root (`#/$defs/Address`, what pydantic and the Agents SDK emit for nested models,
or `#` for recursion) would no longer resolve. `hoist` moves the root's `$defs`/`definitions` to
the call schema's root under `<tool>.<name>` (tools' definitions never collide) and rewrites
every local `$ref`: to a definition, `#/$defs/<tool>.<name>/...`; to anything else in the
parameters (`#`, `#/properties/...`), into a copy of the parameters kept as `$defs/<tool>`.

`close` sets `additionalProperties: false` on every object schema that lists `properties` and
says nothing about other keys, as llama.cpp's grammar converter does: with it left open, a small
model at temperature 0.8 kept inventing keys until max_tokens. An explicit `true` (or a schema)
is kept. Members of an `allOf` with several parts stay open (each holds only part of the keys).
"""
from __future__ import annotations

import copy
from typing import Any

from kvstrata.serving.tool_calls.schema_walk import DEFINITIONS, children, escape, resolve

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def hoist(tool: str, parameters: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the parameters without their definitions, refs rewritten; the definitions for the root's `$defs`)."""
    params = copy.deepcopy(parameters)
    found = {name: body for key in DEFINITIONS if isinstance(params.get(key), dict)
             for name, body in params.pop(key).items()}
    uses_root = False

    def rewrite(ref: str) -> str:
        nonlocal uses_root
        pointer = resolve(ref)
        if pointer is None:
            return ref  # an anchor or another document: the compiler decides
        for key in DEFINITIONS:
            head = f"/{key}/"
            if pointer.startswith(head):
                return f"#/$defs/{escape(tool)}.{pointer[len(head):]}"
        uses_root = True
        return f"#/$defs/{escape(tool)}{pointer}"

    defs = {f"{tool}.{name}": body for name, body in found.items()}
    for schema in [params, *defs.values()]:
        _rewrite_refs(schema, rewrite)
    if uses_root:
        defs[tool] = params
    return params, defs


def close(schema: Any) -> Any:
    """`schema` (modified in place) with its listed-property objects closed to other keys."""
    stack: list[tuple[Any, bool]] = [(schema, False)]
    while stack:
        node, in_allof = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("properties"), dict) and not any(k in node for k in _OPEN_KEYS) and not in_allof:
            node["additionalProperties"] = False
        shared = len(node.get("allOf") or []) > 1
        stack.extend((c.schema, c.keyword == "allOf" and shared) for c in children(node))
    return schema


def _rewrite_refs(schema: Any, rewrite: Any) -> None:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                node["$ref"] = rewrite(node["$ref"])
            stack.extend(c.schema for c in children(node))
