"""`ChatTemplate`: render a model's Jinja chat template the way `transformers` does.

Same environment as `transformers.utils.chat_template_utils`: an immutable sandbox with
trim_blocks/lstrip_blocks and loopcontrols, a `tojson` filter that does not HTML-escape
(ensure_ascii=False), `raise_exception`, `strftime_now`, and the special-token strings
(bos_token, eos_token, ...) as variables. Templates come from the Hub: they are untrusted code,
hence the sandbox.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning may come under; templates read the first. Mirrors transformers.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The template rejected the conversation (it called raise_exception) or is malformed."""


class ChatTemplate:
    def __init__(self, source: str, special_tokens: Mapping[str, str | None]) -> None:
        self.source = source
        # Only tokens that exist are passed, like transformers' `special_tokens_map`.
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self._template = _compile(source)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages`; `kwargs` (e.g. enable_thinking) reach the template too."""
        chat = [_normalize_message(m) for m in messages]
        try:
            return self._template.render(
                messages=chat,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **kwargs},
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template rejected the conversation: {exc}") from exc


def _normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict copy; list-of-parts content joined into one string; reasoning aliases filled."""
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"each message must be a dict with 'role' and 'content', got {message!r}")
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = join_text_parts(content)
    reasoning = next((out[k] for k in _REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def join_text_parts(parts: list[Any]) -> str:
    """OpenAI content parts -> text. Texts are joined with newlines, as vLLM does."""
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type", "text") == "text" and "text" in part:
            texts.append(str(part["text"]))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ChatTemplateError(f"content part of type {kind!r} is not supported; send text parts only.")
    return "\n".join(texts)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None,
    separators: tuple[str, str] | None = None, sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile (line {exc.lineno}): {exc.message}") from exc


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()
