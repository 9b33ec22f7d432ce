"""Checks of `tools`, `tool_choice`, `response_format` and the calls in earlier assistant messages:
each bad value is a 400 naming the field (`tools[1].function.parameters`, ...)."""
from __future__ import annotations

import json
import re
from typing import Any

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import quote
from kvstrata.serving.tool_calls.constraints import check_schema
from kvstrata.serving.tool_calls.schema_check import SchemaBudget

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function and schema names
MAX_TOOLS = 128
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _name(value: Any, param: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):  # match's `$` would pass a trailing newline
        raise InvalidRequestError(f"{param} must be 1-64 letters, digits, '_' or '-', got {quote(value)}", param)
    return value


def check_tools(tools: list[dict[str, Any]], budget: SchemaBudget) -> None:
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(f"at most {MAX_TOOLS} tools are allowed, got {len(tools)}", "tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        fn = tool["function"]
        name = _name(fn["name"], f"tools[{i}].function.name")
        if name in seen:
            raise InvalidRequestError(f"tools[{i}].function.name {quote(name)} is given twice", f"tools[{i}].function.name")
        seen.add(name)
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise InvalidRequestError(f"tools[{i}].function.description must be a string", f"tools[{i}].function.description")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise InvalidRequestError(f"tools[{i}].function.strict must be a boolean", f"tools[{i}].function.strict")
        params = fn.get("parameters")
        if params is not None:
            param = f"tools[{i}].function.parameters"
            check_schema(params, param, budget)
            if params.get("type", "object") != "object":
                raise InvalidRequestError(f"{param} must describe an object (type 'object')", param)


def forced_tool(tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The tools a call is forced to (all for 'required', one for a named function; [] when not forced)."""
    if tool_choice is None or tool_choice in ("none", "auto"):
        return []
    if tool_choice == "required":
        if not tools:
            raise InvalidRequestError("tool_choice 'required' needs tools", "tool_choice")
        return tools
    if isinstance(tool_choice, str):
        raise InvalidRequestError(f"tool_choice must be 'none', 'auto', 'required' or a function, got {quote(tool_choice)}",
                                  "tool_choice")
    fn = tool_choice.get("function")
    if tool_choice.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequestError("tool_choice must be {'type': 'function', 'function': {'name': ...}}", "tool_choice")
    named = [t for t in tools or [] if t["function"]["name"] == fn["name"]]
    if not named:
        raise InvalidRequestError(f"tool_choice names {quote(fn['name'])}, which is not in tools", "tool_choice.function.name")
    return named


def response_schema(response_format: dict[str, Any] | None, budget: SchemaBudget | None = None) -> dict[str, Any] | None:
    """The JSON schema the reply must follow; None for plain text. With `budget`, the schema is
    checked too (without, it was checked when the request was planned)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMATS:
        raise InvalidRequestError(f"response_format.type must be one of {RESPONSE_FORMATS}, got {quote(kind)}",
                                  "response_format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequestError("response_format.json_schema must be an object with 'name' and 'schema'",
                                  "response_format.json_schema")
    _name(spec.get("name"), "response_format.json_schema.name")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise InvalidRequestError("response_format.json_schema.strict must be a boolean",
                                  "response_format.json_schema.strict")
    schema = spec.get("schema", {"type": "object"})
    if budget is not None:
        check_schema(schema, "response_format.json_schema.schema", budget)
    return schema


def check_history_calls(messages: list[dict[str, Any]]) -> None:
    """Each earlier call: {'id', 'type': 'function', 'function': {'name', 'arguments': JSON text}}."""
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or []):
            param = f"messages[{i}].tool_calls[{j}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or call.get("type", "function") != "function" or not isinstance(fn.get("name"), str):
                raise InvalidRequestError(f"{param} must be {{'id', 'type': 'function', 'function': {{'name', "
                                          "'arguments'}}}}", param)
            args = fn.get("arguments", "{}")
            try:
                parsed = json.loads(args) if isinstance(args, str) else None
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise InvalidRequestError(f"{param}.function.arguments must be a JSON object written as a string",
                                          f"{param}.function.arguments")
