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


def _template_source(tokenizer: Tokenizer) -> str | None:
    return tokenizer.chat_template.source if tokenizer.chat_template is not None else None


def reply_format(req: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> ToolCallFormat | None:
    """The format replies are parsed with (None: not parsed for calls)."""
    if not req.tools or req.tool_choice == "none":
        return None
    if response_schema(req.response_format) is not None and not forced_tool(req.tool_choice, req.tools):
        return None  # the reply is the structured content
    return pick_format(parser, _template_source(tokenizer))


def template_input(req: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> tuple[list[dict[str, Any]],
                                                                                     list[dict[str, Any]] | None]:
    """(messages, tools) the chat template renders; no checks (the DP gateway renders prompts with
    it too, so its page hashes are the rank's)."""
    source = _template_source(tokenizer)
    shown = None if req.tool_choice == "none" else req.tools
    messages = [m.for_template() for m in req.messages]
    return messages_for_template(messages, shown, pick_format(parser, source), template_renders_tools(source))


def plan_tools(req: ChatCompletionRequest, tokenizer: Tokenizer, parser: str) -> ToolPlan:
    """Validate the tool fields (400s naming them) and plan the prompt and the constraint."""
    check_history_calls([m.for_template() for m in req.messages])
    budget = SchemaBudget()  # OpenAI's limits hold over all of the request's schemas
    if req.tools:
        check_tools(req.tools, budget)
    forced = forced_tool(req.tool_choice, req.tools)
    schema = response_schema(req.response_format, budget)
    messages, template_tools = template_input(req, tokenizer, parser)
    fmt = pick_format(parser, _template_source(tokenizer))
    grammar = tool_call_grammar(fmt, forced) if forced else json_grammar(schema) if schema is not None else None
    return ToolPlan(messages, template_tools, reply_format(req, tokenizer, parser), grammar)
