"""Per-request sampling parameters (the offline API's `SamplingParams`)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvstrata.config import GREEDY_BELOW

if TYPE_CHECKING:
    from kvstrata.engine.spec.drafter import SpecStats

PROMPT_CACHE_KEY_MAX_CHARS = 1024  # OpenAI's limit on prompt_cache_key
# prompt_cache_retention values (OpenAI's two), and Anthropic's cache_control TTLs (serving/messages/)
RETENTION_CLASSES = ("in_memory", "24h", "5m", "1h")


MAX_STOP_STRING_CHARS = 256  # a stop string is held back from the stream while it may be forming
MAX_STOP_TOKEN_IDS = 64  # each one is compared with every generated token
MAX_SEED = 2**63 - 1  # what a torch.Generator takes
MAX_LOGPROBS = 20  # top logprobs per token (OpenAI's chat limit; completions allow 5, checked by the route)
MAX_LOGIT_BIAS = 300  # token ids one request may bias (OpenAI's limit)
MAX_PRIORITY = 2**31 - 1


class InvalidRequestError(ValueError):
    """A request the user can fix; the server maps it to a 400 with `param` set."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    extra_key: str | None = None  # tenant / cache_salt: requests with different keys share no pages
    cache_key: str | None = None  # prompt_cache_key: a session hint (stats, logs, gateway routing)
    retention: str = "in_memory"  # prompt_cache_retention: "24h" pins the prompt's pages longer
    retain_tokens: int = 0  # the retention covers the prompt's first N tokens only (a cache_control breakpoint); 0: all
    grammar: str | None = None  # llguidance grammar the output must follow (engine/grammar.py)
    # penalties and filters (model/penalties.py has the order they apply in); the defaults are off
    presence_penalty: float = 0.0  # OpenAI's: minus this once a token was generated
    frequency_penalty: float = 0.0  # OpenAI's: minus this for each time a token was generated
    repetition_penalty: float = 1.0  # transformers'/vLLM's: prompt and output tokens' logits divided (>0) or times it
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability (after temperature)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), ids ascending
    logprobs: int | None = None  # each generated token's logprob and this many top alternatives; None: none
    priority: int = 0  # vLLM's: lower is served first (admission, prefill order); the higher is preempted first
    prompt_logprobs: int | None = None  # the same for each prompt token (completions' echo); None: none
    next_turn: tuple[int, ...] = ()  # chat: the template's turn end and next opener, prefilled after the reply (next_turn.py)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "next_turn", tuple(self.next_turn))
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in dict(self.logit_bias).items())))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def penalized(self) -> bool:
        """Whether a penalty or a logit bias changes this request's logits (model/penalties.py)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias)

    def validate(self, vocab_size: int, max_n: int = 8, max_stop: int = 16) -> None:
        """Raise InvalidRequestError with the offending parameter named."""
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {self.max_tokens}", "max_tokens")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequestError(
                f"temperature must be a finite number >= 0, got {self.temperature}", "temperature"
            )
        if self.seed is not None and not (-(2**63) <= self.seed <= MAX_SEED):
            raise InvalidRequestError(f"seed must fit in a signed 64-bit integer, got {self.seed}", "seed")
        if self.seed is not None and self.n > 1 and self.seed + self.n - 1 > MAX_SEED:  # choice i samples with seed + i
            raise InvalidRequestError(
                f"seed {self.seed} with n={self.n}: choice i samples with seed + i, which must stay <= {MAX_SEED}; "
                f"send a seed <= {MAX_SEED - self.n + 1}", "seed",
            )
        if not math.isfinite(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.top_k < -1:
            raise InvalidRequestError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}", "top_k")
        self._validate_penalties(vocab_size)
        if not (isinstance(self.priority, int) and -MAX_PRIORITY <= self.priority <= MAX_PRIORITY):
            raise InvalidRequestError(f"priority must be an integer in [-{MAX_PRIORITY}, {MAX_PRIORITY}], "
                                      f"got {self.priority!r}", "priority")
        if not (1 <= self.n <= max_n):
            raise InvalidRequestError(f"n must be between 1 and {max_n}, got {self.n}", "n")
        if self.retention not in RETENTION_CLASSES:
            msg = f"prompt_cache_retention must be one of {list(RETENTION_CLASSES)}, got {self.retention!r}"
            raise InvalidRequestError(msg, "prompt_cache_retention")
        if not isinstance(self.retain_tokens, int) or self.retain_tokens < 0:
            raise InvalidRequestError(f"retain_tokens must be >= 0, got {self.retain_tokens!r}", "cache_control")
        if self.cache_key is not None and len(self.cache_key) > PROMPT_CACHE_KEY_MAX_CHARS:
            msg = f"prompt_cache_key must be at most {PROMPT_CACHE_KEY_MAX_CHARS} characters, got {len(self.cache_key)}"
            raise InvalidRequestError(msg, "prompt_cache_key")
        if len(self.stop) > max_stop:
            raise InvalidRequestError(f"at most {max_stop} stop strings are allowed, got {len(self.stop)}", "stop")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings", "stop")
        long_stop = [s for s in self.stop if len(s) > MAX_STOP_STRING_CHARS]
        if long_stop:
            raise InvalidRequestError(
                f"stop strings may be at most {MAX_STOP_STRING_CHARS} characters, got one of {len(long_stop[0])}", "stop"
            )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise InvalidRequestError(
                f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed, got {len(self.stop_token_ids)}",
                "stop_token_ids",
            )
        bad = [t for t in self.stop_token_ids if not (0 <= t < vocab_size)]
        if bad:
            raise InvalidRequestError(
                f"stop_token_ids {bad} are outside the vocabulary [0, {vocab_size})", "stop_token_ids"
            )

    def _validate_penalties(self, vocab_size: int) -> None:
        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0), ("min_p", 0.0, 1.0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and lo <= value <= hi):
                raise InvalidRequestError(f"{name} must be between {lo:g} and {hi:g}, got {value}", name)
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            msg = f"repetition_penalty must be a finite number > 0 (1 = off), got {self.repetition_penalty}"
            raise InvalidRequestError(msg, "repetition_penalty")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            msg = f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens, got {len(self.logit_bias)}"
            raise InvalidRequestError(msg, "logit_bias")
        for token, bias in self.logit_bias:
            if not 0 <= token < vocab_size:
                raise InvalidRequestError(f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})",
                                          "logit_bias")
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                raise InvalidRequestError(f"logit_bias values must be between -100 and 100, got {bias}", "logit_bias")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and 0 <= value <= MAX_LOGPROBS):
                raise InvalidRequestError(f"{name} must be between 0 and {MAX_LOGPROBS}, got {value}", name)


@dataclass
class RequestStats:
    """Timings and counts of one request; all times from time.monotonic()."""

    arrival: float = 0.0
    scheduled: float | None = None  # first time any of its tokens ran
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from a cache (any tier)
    output_tokens: int = 0
    tier_tokens: dict[str, int] = field(default_factory=dict)  # device/host/store -> tokens
    cache_key: str | None = None  # the request's prompt_cache_key
    retention: str = "in_memory"  # the request's prompt_cache_retention
    spec: SpecStats | None = None  # speculative decoding: the request's drafter's counts (engine/spec/)

    @property
    def tpot_s(self) -> float | None:
        """Mean seconds per output token after the first; None before the end or with fewer than 2 tokens."""
        if self.first_token is None or self.finished is None or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)

    def as_log_fields(self, finish_reason: str | None) -> dict[str, object]:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000.0, 2)

        tpot = self.tpot_s
        decode_tps = round(1.0 / tpot, 2) if tpot else None
        return {
            "prompt_tokens": self.prompt_tokens,
            "cache_tokens": self.cached_tokens,
            "cache_hit_rate": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
            **{f"{tier}_tokens": n for tier, n in self.tier_tokens.items()},
            "queue_ms": ms(self.arrival, self.scheduled),
            "prefill_ms": ms(self.scheduled, self.first_token),
            "ttft_ms": ms(self.arrival, self.first_token),
            "total_ms": ms(self.arrival, self.finished),
            "decode_tps": decode_tps,
            "output_tokens": self.output_tokens,
            "finish_reason": finish_reason,
            "retention": self.retention,
            **({"spec_drafted": self.spec.drafted, "spec_accepted": self.spec.accepted,
                "spec_accept_lengths": ",".join(f"{k}:{v}" for k, v in sorted(self.spec.accepted_lengths.items()))}
               if self.spec is not None and self.spec.drafted else {}),
            **({"prompt_cache_key": json.dumps(self.cache_key)} if self.cache_key is not None else {}),
        }
