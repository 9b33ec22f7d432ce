"""What the engine hands back for a request: one RequestOutput per step that produced something."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvstrata.engine.sampling_params import RequestStats
from kvstrata.model.logprobs import TokenLogprob


class EngineDeadError(RuntimeError):
    """The engine thread has died; the server answers 503 and /health fails."""


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full; the server answers 429."""


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]  # tokens produced since the previous output
    new_text: str  # text delta, with stop strings already cut
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0  # total generated so far
    error: str | None = None  # set when finish_reason == "error"
    stop_string: str | None = None  # the stop string that ended the request (finish_reason "stop")
    stats: RequestStats = field(default_factory=RequestStats)
    new_logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None  # once, in the first output: per prompt token
