"""Request: one sequence's tokens, pages and progress inside the engine."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kvstrata.engine.sampling_params import RequestStats, SamplingParams
from kvstrata.model.logprobs import TokenLogprob


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """token_ids = prompt + generated so far. Tokens [0, num_computed_tokens) have K/V in `pages`.

    Page table layout: pages[:num_shared_pages] belong to the prefix cache (kept alive by the
    lock on `cache_node`); pages[num_shared_pages:] are this request's own.
    """

    request_id: str
    token_ids: list[int]
    params: SamplingParams
    num_prompt_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    pages: list[int] = field(default_factory=list)
    num_shared_pages: int = 0
    cache_node: Any = None
    num_computed_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    generator: torch.Generator | None = None
    matcher: Any = None  # llguidance matcher when params.grammar is set (engine/grammar.py)
    admitted_once: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token (params.logprobs set)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # per prompt token; the first None
    _prompt_mask: torch.Tensor | None = None  # [V] bool, the prompt's tokens (repetition_penalty)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)
        self.stats.prompt_tokens = self.num_prompt_tokens
        self.stats.cache_key, self.stats.retention = self.params.cache_key, self.params.retention
        if not self.stats.arrival:
            self.stats.arrival = time.monotonic()

    def sampling_generator(self, device: torch.device) -> torch.Generator | None:
        """The seeded request's generator, made once on `device` (where its logits are: a CUDA draw
        needs a CUDA generator); None for greedy or unseeded requests."""
        if self.generator is None and not self.params.greedy and self.params.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(self.params.seed & 0xFFFF_FFFF_FFFF_FFFF)
        return self.generator

    def prompt_mask(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        """[V] bool, True at the prompt's tokens: made once, read by each step's repetition penalty."""
        if self._prompt_mask is None:
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[torch.tensor(self.token_ids[: self.num_prompt_tokens], dtype=torch.long)] = True
            self._prompt_mask = mask.to(device)
        return self._prompt_mask

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
