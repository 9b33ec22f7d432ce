"""A forced call's schema (serving/tool_calls/arguments_schema.py, constraints.py): parameters with
`$defs` (what pydantic and the Agents SDK send for nested models) still resolve once nested under
`arguments`, and objects are closed to unlisted keys unless the schema says otherwise. Checked
with llguidance's own matcher over the real SmolLM2 tokenizer."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from pydantic import BaseModel

from kvstrata.model.tokenizer import Tokenizer
from kvstrata.serving.tool_calls.arguments_schema import close, hoist
from kvstrata.serving.tool_calls.constraints import tool_call_grammar
from kvstrata.serving.tool_calls.formats import FORMATS


class Address(BaseModel):
    city: str
    zip_code: str


class Person(BaseModel):
    name: str
    home: Address
    friends: list[Person] = []


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.fixture(scope="module")
def accepts(smollm2_path: Path) -> Any:
    tok = Tokenizer.from_path(smollm2_path)
    llt = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=list(tok.eos_token_ids))

    def check(grammar: str, text: str) -> bool:
        m = llguidance.LLMatcher(llt, grammar, log_level=0)
        assert not m.is_error(), m.get_error()
        return m.consume_tokens(tok.encode(text)) and m.is_accepting()

    return check


def test_pydantic_defs_resolve_under_arguments(accepts: Any) -> None:
    grammar = tool_call_grammar(FORMATS["json"], [tool("save", Person.model_json_schema())])
    home = {"city": "Paris", "zip_code": "75001"}
    args = {"name": "Ann", "home": home, "friends": [{"name": "Bo", "home": home, "friends": []}]}
    assert accepts(grammar, json.dumps({"name": "save", "arguments": args}))
    assert not accepts(grammar, json.dumps({"name": "save", "arguments": {"name": "Ann", "home": {"city": "P"}}}))


def test_defs_of_two_tools_do_not_collide(accepts: Any) -> None:
    a = {"type": "object", "properties": {"x": {"$ref": "#/$defs/T"}}, "required": ["x"],
         "$defs": {"T": {"type": "integer"}}}
    b = {"type": "object", "properties": {"x": {"$ref": "#/definitions/T"}}, "required": ["x"],
         "definitions": {"T": {"type": "string"}}}
    grammar = tool_call_grammar(FORMATS["hermes"], [tool("a", a), tool("b", b)])
    assert accepts(grammar, '<tool_call>\n{"name": "a", "arguments": {"x": 5}}\n</tool_call>')
    assert accepts(grammar, '<tool_call>\n{"name": "b", "arguments": {"x": "s"}}\n</tool_call>')
    assert not accepts(grammar, '<tool_call>\n{"name": "a", "arguments": {"x": "s"}}\n</tool_call>')


def test_refs_to_the_parameters_root_follow_it() -> None:
    params, defs = hoist("f", {"type": "object", "properties": {"kid": {"$ref": "#"}, "n": {"$ref": "#/properties/m"},
                                                                "m": {"type": "integer"}}})
    assert params["properties"]["kid"] == {"$ref": "#/$defs/f"} and defs["f"] is params
    assert params["properties"]["n"] == {"$ref": "#/$defs/f/properties/m"}


def test_unlisted_keys_are_refused_unless_allowed(accepts: Any) -> None:
    open_params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    closed = tool_call_grammar(FORMATS["json"], [tool("w", open_params)])
    assert accepts(closed, '{"name": "w", "arguments": {"city": "Rome"}}')
    assert not accepts(closed, '{"name": "w", "arguments": {"city": "Rome", "custom": 1}}')
    allowed = tool_call_grammar(FORMATS["json"], [tool("w", {**open_params, "additionalProperties": True})])
    assert accepts(allowed, '{"name": "w", "arguments": {"city": "Rome", "custom": 1}}')


def test_close_leaves_open_schemas_and_allof_parts_alone() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
                                               "m": {"type": "object", "additionalProperties": {"type": "integer"}}},
              "allOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]}
    close(schema)
    assert schema["additionalProperties"] is False and schema["properties"]["a"]["additionalProperties"] is False
    assert schema["properties"]["m"]["additionalProperties"] == {"type": "integer"}
    assert all("additionalProperties" not in part for part in schema["allOf"])
