"""Grammars (llguidance's format) that constrain a reply: a call to one of the tools, or JSON.

JSON is written without free whitespace, with `", "` and `": "` between items and keys (what
`json.dumps` writes): a small model cannot wander off into blank lines, and a call the model made
re-renders in the next turn's prompt (`ToolCallFormat.render_call`) as the same text.
`check_schema` compiles a schema once to refuse, with a 400 naming the field, what llguidance
cannot honour.
"""
from __future__ import annotations

import json
from typing import Any

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.tool_calls.formats import ToolCallFormat

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _llg() -> Any:
    import llguidance

    return llguidance.LLMatcher


def json_grammar(schema: dict[str, Any]) -> str:
    return str(_llg().grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def check_schema(schema: Any, param: str) -> None:
    """400 naming `param` unless `schema` is a JSON schema constrained decoding can follow."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param} must be a JSON schema object, got {type(schema).__name__}", param)
    try:
        error = _llg().validate_grammar(json_grammar(schema))
    except (ValueError, TypeError) as exc:
        error = str(exc)
    if error:
        raise InvalidRequestError(f"{param} is not a JSON schema kvstrata can follow: {error}", param)


def call_schema(fmt: ToolCallFormat, name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """One call of tool `name`, keys in the order the family writes them."""
    return {
        "type": "object",
        "properties": {"name": {"const": name}, fmt.args_key: parameters or ANY_OBJECT},
        "required": ["name", fmt.args_key],
        "additionalProperties": False,
    }


def tool_call_grammar(fmt: ToolCallFormat, tools: list[dict[str, Any]]) -> str:
    """Exactly one call, to one of `tools` (pass one tool to force it), in the family's syntax."""
    options = [call_schema(fmt, t["function"]["name"], t["function"].get("parameters")) for t in tools]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if not (fmt.start or fmt.end):
        return json_grammar(schema)
    body = json.dumps({**schema, "x-guidance": JSON_OPTIONS})
    lark = f"start: {json.dumps(fmt.start)} call {json.dumps(fmt.end)}\ncall: %json {body}\n"
    return str(_llg().grammar_from_lark(lark))
