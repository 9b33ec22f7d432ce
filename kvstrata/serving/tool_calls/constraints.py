"""Grammars (llguidance's format) that constrain a reply: a call to one of the tools, or JSON.

JSON is written without free whitespace, with `", "` and `": "` between items and keys (what
`json.dumps` writes): a small model cannot wander off into blank lines, and a call the model made
re-renders in the next turn's prompt (`ToolCallFormat.render_call`) as the same text.
`check_schema` refuses, with a 400 naming the field, a schema over OpenAI's limits or with no
finite value (schema_check.py), or one llguidance cannot compile (validated once per distinct
schema, then remembered). A forced call's schema holds each tool's parameters with their `$defs`
hoisted to its root and their objects closed to unlisted keys (arguments_schema.py).
"""
from __future__ import annotations

import functools
import json
from typing import Any

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.tool_calls.arguments_schema import close, hoist
from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.schema_check import SchemaBudget

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _llg() -> Any:
    import llguidance

    return llguidance.LLMatcher


def json_grammar(schema: dict[str, Any]) -> str:
    return str(_llg().grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def check_schema(schema: Any, param: str, budget: SchemaBudget) -> None:
    """400 naming `param` unless `schema` is a JSON schema constrained decoding can follow."""
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param} must be a JSON schema object, got {type(schema).__name__}", param)
    budget.check(schema, param)
    error = _grammar_error(json.dumps(schema, sort_keys=True))
    if error:
        raise InvalidRequestError(f"{param} is not a JSON schema kvstrata can follow: {error[:200]}", param)


@functools.lru_cache(maxsize=256)
def _grammar_error(schema_json: str) -> str:
    """llguidance's complaint about a schema ("" when it compiles); agents resend the same schemas."""
    try:
        return str(_llg().validate_grammar(json_grammar(json.loads(schema_json))))
    except (ValueError, TypeError) as exc:
        return str(exc)


def call_schema(
    fmt: ToolCallFormat, name: str, parameters: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(one call of tool `name`, keys in the order the family writes them; the definitions it refers to)."""
    args, defs = hoist(name, parameters) if parameters is not None else (dict(ANY_OBJECT), {})
    for schema in [args, *defs.values()]:
        close(schema)
    call = {
        "type": "object",
        "properties": {"name": {"const": name}, fmt.args_key: args},
        "required": ["name", fmt.args_key],
        "additionalProperties": False,
    }
    return call, defs


def tool_call_grammar(fmt: ToolCallFormat, tools: list[dict[str, Any]]) -> str:
    """Exactly one call, to one of `tools` (pass one tool to force it), in the family's syntax."""
    options, defs = [], {}
    for t in tools:
        call, tool_defs = call_schema(fmt, t["function"]["name"], t["function"].get("parameters"))
        options.append(call)
        defs.update(tool_defs)
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        schema = {**schema, "$defs": defs}
    if not (fmt.start or fmt.end):
        return json_grammar(schema)
    body = json.dumps({**schema, "x-guidance": JSON_OPTIONS})
    lark = f"start: {json.dumps(fmt.start)} call {json.dumps(fmt.end)}\ncall: %json {body}\n"
    return str(_llg().grammar_from_lark(lark))
