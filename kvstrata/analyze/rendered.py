"""Requests as the model sees them: read from a log, rendered through the chat template, tokenized.

`load_requests` accepts our `--log-requests` file (`{"ts", "endpoint", "body"}` per line) or a
JSONL of bare OpenAI chat request bodies (`{"messages": [...], "tools": [...]}` per line).
`Rendered` keeps the token ids, each token's character span, and where each message field sits in
the rendered text, so a token offset can be traced back to "message 0 (system), field content".
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstrata.model.tokenizer import Tokenizer

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
TEXT_FIELDS = (*REASONING_FIELDS, "content")


class AnalyzeInputError(ValueError):
    """The input file is not a request log nor a JSONL of chat request bodies."""


def load_requests(path: str | Path) -> list[dict[str, Any]]:
    """The chat request bodies in file order (completions and malformed lines are skipped)."""
    bodies: list[dict[str, Any]] = []
    p = Path(path).expanduser()
    if not p.is_file():
        raise AnalyzeInputError(f"{p} does not exist; pass a --log-requests file or a JSONL of request bodies")
    for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AnalyzeInputError(f"{p}:{number} is not JSON ({exc.msg}); one request per line") from exc
        body = entry.get("body", entry) if isinstance(entry, dict) else None
        if isinstance(body, dict) and isinstance(body.get("messages"), list) and body["messages"]:
            bodies.append(body)
    if not bodies:
        raise AnalyzeInputError(f"{p} holds no chat requests (lines with a 'messages' list, or a 'body' holding one)")
    return bodies


def _text(value: Any) -> str:
    if isinstance(value, list):  # content parts
        return "\n".join(p.get("text", "") for p in value if isinstance(p, dict))
    return "" if value is None else str(value)


@dataclass(frozen=True)
class FieldSpan:
    message: int  # index into messages
    role: str
    field: str  # "content", "reasoning_content", ...
    start: int  # character span in the rendered text
    end: int


@dataclass(frozen=True)
class Location:
    """Where a character of the rendered text comes from."""

    message: int | None  # None: template markup (role headers, tools block, separators)
    role: str | None
    field: str | None
    offset: int  # characters into the field (or into the text, for markup)

    def describe(self) -> str:
        if self.message is None:
            return f"template markup at char {self.offset}"
        return f"message {self.message} ({self.role}) {self.field}, char {self.offset}"


@dataclass(frozen=True)
class Rendered:
    index: int  # position in the log
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]  # [num_tokens] character span of each token
    spans: tuple[FieldSpan, ...]
    cache_key: str | None = None  # the body's prompt_cache_key (a string), when it has one

    def field(self, message: int, field: str) -> str | None:
        if message >= len(self.messages):
            return None
        value = self.messages[message].get(field)
        return None if value is None else _text(value)

    def char_of_token(self, token: int) -> int:
        return self.offsets[token][0] if token < len(self.offsets) else len(self.text)

    def locate(self, char: int) -> Location:
        for span in self.spans:
            if span.start <= char < span.end:
                return Location(span.message, span.role, span.field, char - span.start)
        return Location(None, None, None, char)

    def span_end(self, message: int) -> int:
        """Token count up to the end of `message`'s last rendered field (0 if not found)."""
        ends = [s.end for s in self.spans if s.message == message]
        if not ends:
            return 0
        end = max(ends)
        return sum(1 for start, _ in self.offsets if start < end)


def _template_text(tokenizer: Tokenizer, body: dict[str, Any], messages: list[dict[str, Any]],
                   tools: list[Any] | None) -> str:
    """The prompt as a rank renders it (tools written into the system message where the template has no
    tool syntax, the request's template kwargs); a body the server would refuse, as the template alone
    renders it."""
    from pydantic import ValidationError

    from kvstrata.serving.protocol import ChatCompletionRequest
    from kvstrata.serving.tool_calls.plan import template_input

    try:
        req = ChatCompletionRequest.model_validate(body)
        shown, shown_tools = template_input(req, tokenizer, "auto")
        return tokenizer.apply_chat_template(shown, add_generation_prompt=True, tools=shown_tools,
                                             **req.template_kwargs())
    except (ValidationError, ValueError):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)


def render(tokenizer: Tokenizer, body: dict[str, Any], index: int) -> Rendered:
    messages = [m for m in body["messages"] if isinstance(m, dict)]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    text = _template_text(tokenizer, body, messages, tools)
    encoding = tokenizer.backend.encode(text, add_special_tokens=False)
    spans: list[FieldSpan] = []
    pos = 0
    for i, message in enumerate(messages):
        end = pos
        for field in TEXT_FIELDS:
            value = _text(message.get(field))
            if not value:
                continue
            start = text.find(value, pos)
            if start >= 0:
                spans.append(FieldSpan(i, str(message.get("role")), field, start, start + len(value)))
                end = max(end, start + len(value))
        pos = end
    key = body.get("prompt_cache_key") if isinstance(body.get("prompt_cache_key"), str) else None
    return Rendered(index, messages, tools, text, list(encoding.ids), list(encoding.offsets), tuple(spans), key)
