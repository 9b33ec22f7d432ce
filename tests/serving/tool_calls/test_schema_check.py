"""Schemas refused before they reach the grammar compiler (serving/tool_calls/schema_check.py):
OpenAI's size limits, and any part a reply could enter that has no finite value."""
from __future__ import annotations

from typing import Any

import pytest

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.tool_calls.schema_check import MAX_NAME_CHARS, MAX_NESTING, MAX_PROPERTIES, SchemaBudget


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def props(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


REFUSED = {
    "only a $ref to itself": {"$ref": "#"},
    "two definitions in a cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                   "$ref": "#/$defs/a"},
    "allOf of itself": {"allOf": [{"$ref": "#"}]},
    "a required property holding its own object": {"type": "object", "properties": {"next": {"$ref": "#"}},
                                                   "required": ["next"]},
    "an optional property that loops": {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}},
    "a non-empty array of itself": {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    "a false schema": {"type": "object", "properties": {"a": False}, "required": ["a"]},
    f"{MAX_PROPERTIES * 2} properties": props(MAX_PROPERTIES * 2),
    f"{MAX_NESTING + 1} levels": nested(MAX_NESTING + 1),
    "too many characters of enum values": {"enum": ["x" * 1000] * (MAX_NAME_CHARS // 1000 + 1)},
}
ACCEPTED = {
    "a tree with optional children": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
    "an anyOf with a way out": {"anyOf": [{"$ref": "#"}, {"type": "integer"}]},
    "closed objects": {"type": "object", "properties": {"a": {"type": "array", "items": False}},
                       "additionalProperties": False},
    "an unused looping definition": {"type": "object", "$defs": {"x": {"$ref": "#/$defs/x"}}},
    f"{MAX_PROPERTIES} properties": props(MAX_PROPERTIES),
    f"{MAX_NESTING} levels": nested(MAX_NESTING),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refused(name: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SchemaBudget().check(REFUSED[name], "tools[0].function.parameters")
    assert info.value.param == "tools[0].function.parameters" and len(info.value.message) < 400


@pytest.mark.parametrize("name", ACCEPTED)
def test_accepted(name: str) -> None:
    SchemaBudget().check(ACCEPTED[name], "response_format.json_schema.schema")


def test_the_limits_hold_over_all_of_a_requests_schemas() -> None:
    budget = SchemaBudget()
    budget.check(props(MAX_PROPERTIES // 2), "tools[0].function.parameters")
    budget.check(props(MAX_PROPERTIES // 2), "tools[1].function.parameters")
    with pytest.raises(InvalidRequestError) as info:
        budget.check(props(1), "tools[2].function.parameters")
    assert info.value.param == "tools[2].function.parameters"
