"""Trace hash ids -> token-id prompts: one fixed block of token ids per hash id.

    block(h) = [d0, d1, d2, r3, r4, ...]    (block_tokens ids, all in [low, high))
               d0 d1 d2: h written in base (high - low), lowest digit first: different ids differ here
               r_j:      a splitmix64 hash of (seed, h, j), so the rest looks like text, not a pattern

Same id, same tokens (deterministic, no state); different ids, different tokens (the digits), as
long as h < (high - low) ** min(block_tokens, 3), which `block()` checks. The range
[1000, 30000) avoids the special tokens of common vocabularies (SmolLM2/Llama/Qwen put theirs
below 1000 or above 30000), so every server takes the ids as plain text.

A request's prompt is its blocks in order, cut to `scaled_length`: the trace's 512-token block
becomes `block_tokens` tokens (16 by default, so a slice's prompts stay short enough for a small CPU
to prefill), and the last block is cut in proportion, ceil(input_length * block_tokens / 512) tokens
in all. Requests that share a
leading run of ids therefore share exactly that token prefix.
"""
from __future__ import annotations

import numpy as np

from kvstrata.bench.trace.format import TRACE_BLOCK_SIZE, TraceRequest

TOKEN_LOW = 1000
TOKEN_HIGH = 30000
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return x ^ (x >> np.uint64(31))


class BlockTokens:
    """The id -> tokens mapping at one block size; `prompt(request)` is a request's token ids."""

    def __init__(
        self, block_tokens: int = 16, seed: int = 0, low: int = TOKEN_LOW, high: int = TOKEN_HIGH,
        trace_block: int = TRACE_BLOCK_SIZE,
    ) -> None:
        if block_tokens < 1 or block_tokens > trace_block:
            raise ValueError(f"--block-tokens must be in [1, {trace_block}] (got {block_tokens})")
        if not 0 <= low < high:
            raise ValueError(f"token range [{low}, {high}) is empty")
        self.block_tokens = block_tokens
        self.trace_block = trace_block
        self.seed = seed
        self.low, self.span = low, high - low
        self._digits = min(block_tokens, 3)
        self._cache: dict[int, list[int]] = {}
        j = np.arange(self._digits, block_tokens, dtype=np.uint64)
        self._salt = (np.uint64(seed & 0xFFFFFFFF) << np.uint64(32)) ^ (j << np.uint64(20))

    def block(self, h: int) -> list[int]:
        """The block_tokens token ids of hash id `h`."""
        got = self._cache.get(h)
        if got is not None:
            return got
        if not 0 <= h < self.span**self._digits:
            raise ValueError(
                f"hash id {h} needs more than {self._digits} tokens to stay distinct at --block-tokens "
                f"{self.block_tokens}; use a larger --block-tokens"
            )
        digits = [self.low + (h // self.span**d) % self.span for d in range(self._digits)]
        rest = _splitmix64(self._salt ^ np.uint64(h)) % np.uint64(self.span) + np.uint64(self.low)
        got = digits + rest.tolist()
        self._cache[h] = got
        return got

    def scaled_length(self, input_length: int) -> int:
        """Prompt tokens at this block size: ceil(input_length * block_tokens / trace_block)."""
        return -(-input_length * self.block_tokens // self.trace_block)

    def prompt(self, req: TraceRequest) -> list[int]:
        """The request's blocks in order, the last one cut so the prompt has scaled_length tokens."""
        n = self.scaled_length(req.input_length)
        out: list[int] = []
        for h in req.hash_ids:
            if len(out) >= n:
                break
            out.extend(self.block(h))
        return out[:n]

    def full_blocks(self, req: TraceRequest) -> list[int]:
        """Every block whole (no cut): the simulator's ideal mode."""
        out: list[int] = []
        for h in req.hash_ids:
            out.extend(self.block(h))
        return out
