"""Malformed tools, tool_choice, response_format and earlier tool calls: each a 4xx with `param`."""
from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import USER, make_state, serve
from test_malformed import JSON_CT, Case, H, chat, check_error

OK_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
NESTED = {"type": "object", "properties": {"home": {"$ref": "#/$defs/Address"}}, "required": ["home"],
          "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def fn(name: str = "get_weather", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": OK_PARAMS, **extra}}


def tools(*extra: dict[str, Any]) -> dict[str, Any]:
    return chat(tools=[fn(), *extra])


CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def history(call: Any) -> dict[str, Any]:
    return chat(messages=[*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                          {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])


CASES = [
    # tools
    Case("tool name with spaces", H, chat(tools=[fn("get weather")]), param="tools[0].function.name"),
    Case("tool name too long", H, chat(tools=[fn("x" * 65)]), param="tools[0].function.name"),
    Case("tool name empty", H, chat(tools=[fn("")]), param="tools[0].function.name"),
    Case("tool name with a trailing newline", H, chat(tools=[fn("get_weather\n")]), param="tools[0].function.name"),
    Case("duplicate tool names", H, tools(fn()), param="tools[1].function.name"),
    Case("tool parameters a list", H, chat(tools=[fn(parameters=[1])]), param="tools[0].function.parameters"),
    Case("tool parameters a string", H, chat(tools=[fn(parameters="{}")]), param="tools[0].function.parameters"),
    Case("tool parameters unknown type", H, chat(tools=[fn(parameters={"type": "foo"})]),
         param="tools[0].function.parameters"),
    Case("tool parameters not an object type", H, chat(tools=[fn(parameters={"type": "string"})]),
         param="tools[0].function.parameters"),
    Case("tool parameters properties not an object", H,
         chat(tools=[fn(parameters={"type": "object", "properties": 5})]), param="tools[0].function.parameters"),
    Case("tool parameters dangling $ref", H, chat(tools=[fn(parameters={"$ref": "#/nope"})]),
         param="tools[0].function.parameters"),
    Case("tool parameters only a $ref to themselves", H, chat(tools=[fn(parameters={"$ref": "#"})]),
         param="tools[0].function.parameters"),
    Case("tool parameters a $ref cycle", H, chat(tools=[fn(parameters={
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})]),
        param="tools[0].function.parameters"),
    Case("tool parameters with 10,000 properties", H, chat(tools=[fn(parameters={
        "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}})]),
        param="tools[0].function.parameters"),
    Case("tool description a number", H, chat(tools=[fn(description=5)]), param="tools[0].function.description"),
    Case("tool strict a string", H, chat(tools=[fn(strict="yes")]), param="tools[0].function.strict"),
    Case("too many tools", H, chat(tools=[fn(f"f{i}") for i in range(129)]), param="tools"),
    # tool_choice
    Case("tool_choice required without tools", H, chat(tool_choice="required"), param="tool_choice"),
    Case("tool_choice unknown function", H, tools() | {"tool_choice": {"type": "function", "function": {"name": "x"}}},
         param="tool_choice"),
    Case("tool_choice function without name", H, tools() | {"tool_choice": {"type": "function", "function": {}}},
         param="tool_choice"),
    Case("tool_choice wrong type", H, tools() | {"tool_choice": {"type": "retrieval"}}, param="tool_choice"),
    # response_format
    Case("response_format json_schema missing", H, chat(response_format={"type": "json_schema"}),
         param="response_format.json_schema"),
    Case("response_format schema name missing", H,
         chat(response_format={"type": "json_schema", "json_schema": {"schema": OK_PARAMS}}),
         param="response_format.json_schema.name"),
    Case("response_format schema a list", H,
         chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}),
         param="response_format.json_schema.schema"),
    Case("response_format schema unknown type", H,
         chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
         param="response_format.json_schema.schema"),
    Case("response_format strict a string", H,
         chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": "y", "schema": {}}}),
         param="response_format.json_schema.strict"),
    Case("response_format type missing", H, chat(response_format={}), param="response_format.type"),
    Case("response_format schema only a $ref", H,
         chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}),
         param="response_format.json_schema.schema"),
    # earlier calls in the conversation
    Case("history call without function", H, history({"id": "c1", "type": "function"}),
         param="messages[1].tool_calls[0]"),
    Case("history call arguments not JSON", H,
         history({**CALL, "function": {"name": "get_weather", "arguments": "{city"}}),
         param="messages[1].tool_calls[0].function.arguments"),
    Case("history call arguments a JSON list", H,
         history({**CALL, "function": {"name": "get_weather", "arguments": "[1]"}}),
         param="messages[1].tool_calls[0].function.arguments"),
    Case("history call a string", H, history("get_weather()"), param="messages[1].tool_calls[0]"),
]


@pytest.fixture(scope="module")
def base_url(engine: AsyncEngine) -> Iterator[str]:
    with serve(make_state(engine, ServerConfig(port=0, response_cache_size=16))) as srv:
        yield srv.base_url


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_tool_request_gets_a_4xx_with_param(base_url: str, case: Case) -> None:
    with httpx.Client(base_url=base_url, timeout=60) as http:
        resp = http.post(case.path, content=json.dumps(case.body).encode(), headers=JSON_CT)
        check_error(resp.status_code, resp.headers, resp.content, case.status, case.param)
        assert resp.json()["error"]["param"] is not None


def test_well_formed_tool_requests_are_accepted(base_url: str) -> None:
    good = [
        tools() | {"tool_choice": "required", "max_tokens": 4},
        tools() | {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        chat(response_format={"type": "json_object"}),
        tools() | {"tool_choice": "required", "response_format": {"type": "json_object"}},  # the call wins
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": OK_PARAMS}}),
        history(CALL) | {"tools": [fn()]},
        chat(tools=[fn(parameters=NESTED)], tool_choice="required", max_tokens=4),  # $defs, as pydantic writes them
    ]
    with httpx.Client(base_url=base_url, timeout=300) as http:
        for body in good:
            assert http.post(H, json=body).status_code == 200, body
