"""What tools, tool_choice and response_format make of one chat request: the messages and tools
the template sees, the tool-call format replies are parsed with, and the grammar (if any) the
reply is constrained to.

- tools with tool_choice absent/'auto': the reply is parsed for calls (no constraint);
- 'required' or a named function: the reply is constrained to one call (constraints.py);
- response_format json_object / json_schema: the reply is constrained to the schema and is content
  (a forced call wins over it: that reply is the call; the Agents SDK sends both);
- tool_choice 'none': tools are neither shown to the model nor parsed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvstrata.serving.tool_calls.constraints import json_grammar, tool_call_grammar
from kvstrata.serving.tool_calls.formats import ToolCallFormat, pick_format, template_renders_tools
from kvstrata.serving.tool_calls.render import messages_for_template
from kvstrata.serving.tool_calls.schema_check import SchemaBudget
from kvstrata.serving.tool_calls.validate import check_history_calls, check_tools, forced_tool, response_schema

if TYPE_CHECKING:
    from kvstrata.model.tokenizer import Tokenizer
    from kvstrata.serving.protocol import ChatCompletionRequest


@dataclass(frozen=True)
class ToolPlan:
    messages: list[dict[str, Any]]
    template_tools: list[dict[str, Any]] | None
    tool_format: ToolCallFormat | None  # None: replies are plain content
    grammar: str | None  # llguidance grammar the reply must follow
    constrained: bool  # a forced call or a response_format schema holds from the reply's first token


def _template_source(tokenizer: Tokenizer) -> str | None:
    return tokenizer.chat_template.source if tokenizer.chat_template is not None else None


def _parsed_format(req: ChatCompletionRequest, fmt: ToolCallFormat, forced: list[dict[str, Any]],
                   schema: dict[str, Any] | None) -> ToolCallFormat | None:
    """`fmt` when replies are parsed for calls: tools shown, and no response_format schema unless a
    call is forced (a forced call wins: that reply is the call)."""
    if not req.tools or req.tool_choice == "none" or (schema is not None and not forced):
        return None
    return fmt


def reply_format(req: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> ToolCallFormat | None:
    """The format replies are parsed with (None: not parsed for calls), for a request planned before
    (a response-cache hit replays it: no checks here)."""
    fmt = pick_format(parser, _template_source(tokenizer))
    return _parsed_format(req, fmt, forced_tool(req.tool_choice, req.tools), response_schema(req.response_format))


def template_input(req: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> tuple[list[dict[str, Any]],
                                                                                     list[dict[str, Any]] | None]:
    """(messages, tools) the chat template renders; no checks (the DP gateway renders prompts with
    it too, so its page hashes are the rank's)."""
    source = _template_source(tokenizer)
    return _rendered(req, [m.for_template() for m in req.messages], source, pick_format(parser, source))


def _rendered(req: ChatCompletionRequest, messages: list[dict[str, Any]], source: str | None,
              fmt: ToolCallFormat) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    shown = None if req.tool_choice == "none" else req.tools
    return messages_for_template(messages, shown, fmt, template_renders_tools(source))


def plan_tools(req: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> ToolPlan:
    """One pass over the tool fields: each is checked as the plan takes it (a 400 naming it), and the
    plan is built from what the checks return."""
    history = [m.for_template() for m in req.messages]
    check_history_calls(history)
    budget = SchemaBudget()  # OpenAI's limits hold over all of the request's schemas
    if req.tools:
        check_tools(req.tools, budget)
    forced = forced_tool(req.tool_choice, req.tools)
    schema = response_schema(req.response_format, budget)
    source = _template_source(tokenizer)
    fmt = pick_format(parser, source)
    messages, template_tools = _rendered(req, history, source, fmt)
    grammar = tool_call_grammar(fmt, forced) if forced else json_grammar(schema) if schema is not None else None
    return ToolPlan(messages, template_tools, _parsed_format(req, fmt, forced, schema), grammar,
                    constrained=bool(forced) or schema is not None)
