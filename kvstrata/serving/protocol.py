"""OpenAI request models and their validation into engine inputs (token ids + SamplingParams).

Pydantic checks types (strict: "5" is not an int, 1.0 is not an int, "true" is not a bool) and
shapes; the fields both endpoints share are in sampling_request.py, the base of both request models.
`prepare_chat` / `prepare_completion` (prepare.py) check values against the loaded model
and return a `PreparedRequest`. Unknown fields are ignored, as vLLM does (clients send vendor fields through
`extra_body`; OpenAI itself refuses them). Fields we accept but cannot honour (`suffix`, a `best_of`
other than n) are refused with a 400 rather than ignored.

Logprobs: chat's `logprobs` + `top_logprobs` (0-20), completions' `logprobs` (0-5) and `echo` (the prompt,
and with `logprobs` its tokens' logprobs, the first null). Values are the model's own log-softmax, before
penalties and temperature (model/logprobs.py); penalties and filters apply in model/penalties.py's order.

max_tokens: when absent, chat gets the rest of the context and completions get 16 (OpenAI's
defaults). When prompt + max_tokens exceeds the context, max_tokens is clamped to what fits (the
engine's `check_prompt` does the same), and the choice ends with finish_reason "length"; a
prompt that leaves no room for even one token, or a max_tokens no prompt leaves room for (>= the
context), is a 400 naming both numbers.

/v1/completions takes a batch of prompts too: P prompts with n choices give P*n choices, choice
p*n + i being the i-th of prompt p; usage counts each prompt once.

Reasoning (chat): `chat_template_kwargs` (vLLM's) reach the chat template as variables;
`reasoning_effort` (OpenAI's) reaches it as `reasoning_effort`, and "none" also sets
`enable_thinking: false` (an explicit `chat_template_kwargs.enable_thinking` wins). Thinking off, the
reply is all content; on, it is split (serving/reasoning.py) into `reasoning_content` and content.
An assistant message sent back may carry its `reasoning_content` for the template to render.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import quote
from kvstrata.serving.sampling_request import STRICT, STRINGS_SCHEMA, SamplingRequest

Role = Literal["system", "developer", "user", "assistant", "tool"]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]  # OpenAI's values
# variables the template gets from the request itself: chat_template_kwargs may not replace them
_TEMPLATE_ARGS = ("messages", "tools", "documents", "add_generation_prompt")
# what the plain validators below accept, for /openapi.json (clients, and the schemathesis fuzz test)
_TEXT_PART: dict[str, Any] = {
    "type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_IDS: dict[str, Any] = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Role
    content: str | list[dict[str, Any]] | None = Field(  # a list of text parts is joined with "\n"
        default=None, json_schema_extra={"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
    )
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant reply's reasoning, sent back (vLLM's name)

    @field_validator("content", mode="plain")
    @classmethod
    def _text_only(cls, v: Any) -> str | None:
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("content must be a string or a list of {'type': 'text', 'text': ...} parts")
        texts = []
        for part in v:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"only text content parts are supported, got {quote(kind)}; send text as a string")
            texts.append(part["text"])
        return "\n".join(texts)

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a message with role '{self.role}' needs 'content'")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message with role 'tool' needs 'tool_call_id', the id of the call it answers")
        return self

    def for_template(self) -> dict[str, Any]:
        """The dict the chat template sees; 'developer' is rendered as 'system'."""
        out = self.model_dump(include={"name", "tool_calls", "tool_call_id", "reasoning_content"}, exclude_none=True)
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content or "", **out}


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, gt=0)  # wins over max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # a constrained reply is one call; a free one may hold several
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra template variables (enable_thinking, ...)
    reasoning_effort: ReasoningEffort | None = None  # "none" turns thinking off

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_template_args(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for name in _TEMPLATE_ARGS:
            if name in (v or {}):
                raise ValueError(f"chat_template_kwargs may not set {quote(name)}: the request's own fields give it")
        return v

    def template_kwargs(self) -> dict[str, Any]:
        """What the chat template gets besides messages and tools (see the module docstring)."""
        out: dict[str, Any] = {}
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
            if self.reasoning_effort == "none":
                out["enable_thinking"] = False
        return {**out, **(self.chat_template_kwargs or {})}

    @property
    def thinking(self) -> bool:
        """False when the request turned the model's thinking off (its reply is then all content)."""
        return self.template_kwargs().get("enable_thinking", True) is not False

    @field_validator("tools")
    @classmethod
    def _function_tools(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(v or []):
            fn = tool.get("function")
            if tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
        return v

    @property
    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not (0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            msg = f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.top_logprobs}"
            raise InvalidRequestError(msg, "top_logprobs")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs: true", "top_logprobs")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise InvalidRequestError("tool_choice is only allowed when tools are given", "tool_choice")
        # tools, tool_choice and response_format values: serving/tool_calls/validate.py (via plan_tools)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {**STRINGS_SCHEMA, "minItems": 1}, _IDS, {"type": "array", "items": _IDS, "minItems": 1},
    ]})
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="plain")
    @classmethod
    def _prompt_shape(cls, v: Any) -> str | list[str] | list[int] | list[list[int]]:
        def ids(x: Any) -> bool:
            return isinstance(x, list) and bool(x) and all(type(t) is int for t in x)

        if isinstance(v, str) or ids(v):
            return v
        if isinstance(v, list) and v and (all(isinstance(p, str) for p in v) or all(ids(p) for p in v)):
            return v
        raise ValueError(
            "prompt must be a string, a list of strings, a non-empty list of token ids, or a list of such lists"
        )

    @property
    def wanted_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def wanted_prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_COMPLETION_LOGPROBS:
            msg = f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {self.logprobs}"
            raise InvalidRequestError(msg, "logprobs")
        if self.suffix is not None:
            raise InvalidRequestError("suffix is not supported; omit it", "suffix", "unsupported")
        if self.best_of not in (None, self.n):
            msg = "best_of is not supported; omit it or set it equal to n"
            raise InvalidRequestError(msg, "best_of", "unsupported")
