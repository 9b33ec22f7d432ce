"""OpenAI request models and their validation into engine inputs (token ids + SamplingParams).

Pydantic checks types (strict: "5" is not an int, 1.0 is not an int, "true" is not a bool) and
shapes; `prepare_chat` / `prepare_completion` (prepare.py) check values against the loaded model
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

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvstrata.engine.sampling_params import (
    MAX_PRIORITY,
    PROMPT_CACHE_KEY_MAX_CHARS,
    InvalidRequestError,
    SamplingParams,
)
from kvstrata.serving.errors import quote

Role = Literal["system", "developer", "user", "assistant", "tool"]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions
MAX_TOKEN_ID_DIGITS = 10  # a logit_bias key longer than this is no token id of any vocabulary
MAX_CACHE_SALT_CHARS = 256  # hashed into every page key and kept as a radix-tree key
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]  # OpenAI's values
# variables the template gets from the request itself: chat_template_kwargs may not replace them
_TEMPLATE_ARGS = ("messages", "tools", "documents", "add_generation_prompt")
_STRICT = ConfigDict(strict=True, extra="ignore")
# what the plain validators below accept, for /openapi.json (clients, and the schemathesis fuzz test)
_TEXT_PART: dict[str, Any] = {
    "type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_IDS: dict[str, Any] = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}


class ChatMessage(BaseModel):
    model_config = _STRICT
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


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = _STRICT
    model: str | None = None  # None = the served model
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)  # what a torch.Generator takes
    stop: str | list[str] | None = Field(default=None, json_schema_extra={"anyOf": [{"type": "string"}, _STRINGS]})
    stop_token_ids: list[int] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None  # ignored unless stream is true
    ignore_eos: bool = False
    user: str | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # vLLM's; 1 = off
    min_p: float | None = Field(default=None, ge=0, le=1)  # vLLM's; 0 = off
    logit_bias: dict[str, float] | None = None
    timeout: float | None = Field(default=None, gt=0, le=86400)  # seconds; past it the request is aborted (408)
    # OpenAI's agent-session hints (prompt_hints.py): the gateway routes by the key; "24h" keeps
    # the prompt's pages at a higher retention class in L2/L3
    prompt_cache_key: str | None = Field(default=None, max_length=PROMPT_CACHE_KEY_MAX_CHARS)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    data_parallel_rank: int | None = None  # SGLang's; a lone server is rank 0 of 1 (the gateway pins and strips it)
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)  # vLLM's: lower is served first

    @field_validator("stop", mode="plain")
    @classmethod
    def _stop_strings(cls, v: Any) -> str | list[str] | None:
        if v is None or isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)):
            return v
        raise ValueError("stop must be a string or a list of strings")

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_shape(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
                raise ValueError(f"logit_bias keys must be token ids written as strings, got {quote(key)}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be between -100 and 100, got {bias}")
        return v

    def refuse_unsupported(self) -> None:
        """Values out of OpenAI's ranges and features we cannot honour: 400 naming the field."""
        if self.data_parallel_rank not in (None, 0):
            msg = f"data_parallel_rank must be an integer in [0, 1): this server is one rank, got {self.data_parallel_rank}"
            raise InvalidRequestError(msg, "data_parallel_rank", "invalid_rank")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true", "stream_options")
        if self.temperature is not None and self.temperature > MAX_TEMPERATURE:
            msg = f"temperature must be between 0 and {MAX_TEMPERATURE}, got {self.temperature}"
            raise InvalidRequestError(msg, "temperature")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            seed=self.seed,
            stop=tuple([self.stop] if isinstance(self.stop, str) else (self.stop or [])),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            n=self.n,
            extra_key=self.cache_salt,
            cache_key=self.prompt_cache_key,
            retention=self.prompt_cache_retention or "in_memory",
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            min_p=self.min_p or 0.0,
            logit_bias=tuple((int(k), v) for k, v in (self.logit_bias or {}).items()),
            priority=self.priority,
            logprobs=self.wanted_logprobs,
            prompt_logprobs=self.wanted_prompt_logprobs,
        )

    @property
    def wanted_logprobs(self) -> int | None:
        """Top alternatives per generated token when the request asks for logprobs, else None."""
        return None

    @property
    def wanted_prompt_logprobs(self) -> int | None:
        """The same for the prompt's tokens (completions' echo with logprobs), else None."""
        return None


class ChatCompletionRequest(_SamplingRequest):
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


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {**_STRINGS, "minItems": 1}, _IDS, {"type": "array", "items": _IDS, "minItems": 1},
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
