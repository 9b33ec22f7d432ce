"""The fields /v1/chat/completions and /v1/completions share, and the engine's SamplingParams built from them.

`SamplingRequest` is the base of both request models (protocol.py): sampling, stop conditions, penalties and
logit bias, the prompt-cache and routing hints (`cache_salt`, `prompt_cache_key`, `prompt_cache_retention`,
`data_parallel_rank`), priority and timeout. Pydantic checks types strictly and shapes; `refuse_unsupported`
refuses values out of OpenAI's ranges and features we cannot honour, with a 400 naming the field.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvstrata.engine.sampling_params import (
    MAX_PRIORITY,
    PROMPT_CACHE_KEY_MAX_CHARS,
    InvalidRequestError,
    SamplingParams,
)
from kvstrata.serving.errors import quote

MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
MAX_TOKEN_ID_DIGITS = 10  # a logit_bias key longer than this is no token id of any vocabulary
MAX_CACHE_SALT_CHARS = 256  # hashed into every page key and kept as a radix-tree key
STRICT = ConfigDict(strict=True, extra="ignore")  # the request models': no coercion, unknown fields ignored
# what a plain validator accepts as a list of strings, for /openapi.json (clients, and the schemathesis fuzz test)
STRINGS_SCHEMA: dict[str, Any] = {"type": "array", "items": {"type": "string"}}


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = STRICT
    model: str | None = None  # None = the served model
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)  # what a torch.Generator takes
    stop: str | list[str] | None = Field(default=None, json_schema_extra={"anyOf": [{"type": "string"}, STRINGS_SCHEMA]})
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
