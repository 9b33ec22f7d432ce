"""PrefillProgress: how much of the prefill a rank was given is still to do, as the gateway can tell.

The cost policy prices a rank by the uncached prompt tokens it has been sent and not yet answered. A rank
that has been computing a 4k-token cold prompt for nine seconds is nearly done with it, yet until its first
token that prompt counted whole, and the sessions arriving meanwhile went elsewhere. So the gateway keeps,
per rank, when each unanswered prefill was sent and the rank's prefill speed as it has seen it (uncached
tokens over the time to the answer, of answers to at least `MIN_TOKENS` of them; an exponential average),
and prices the queue as its tokens less what that speed has done since the oldest of them was sent:

    remaining = max(queued tokens - tokens_per_s x (now - oldest unanswered send), 0)

The time to an answer includes any wait in the rank's queue, so queueing never overestimates the speed;
an answer faster than the prefill could be (a response-cache hit, a prefix the gateway's index had not
heard of yet) would, so a sample counts for at most `MAX_STEP` times the speed so far. Only answers that
start a reply (status 200) are samples. Until a first sample the queue counts whole, as before.
Gateway-side only; the clock is passed in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MIN_TOKENS = 256  # an answer to fewer uncached tokens times mostly the rest of the step, not the prefill
SMOOTHING = 0.3  # weight of the newest sample in the speed
MAX_STEP = 2.0  # a sample above this many times the speed so far counts as this many times it


@dataclass
class PrefillProgress:
    tokens: int = 0  # uncached prompt tokens of the rank's unanswered requests
    tokens_per_s: float = 0.0  # the rank's prefill speed; 0 until a first sample
    _sent: dict[int, float] = field(default_factory=dict)  # request handle -> when it was sent

    def sent(self, handle: int, tokens: int, now: float) -> None:
        self.tokens += tokens
        if tokens > 0:
            self._sent[handle] = now

    def answered(self, handle: int, tokens: int, now: float, learn: bool = True) -> None:
        """The rank began its answer to request `handle` (or the request ended without one: `learn` False);
        a large prefill answered teaches the speed."""
        since = self._sent.pop(handle, None)
        self.tokens -= tokens
        if not learn or since is None or tokens < MIN_TOKENS or now <= since:
            return
        sample = tokens / (now - since)
        if not self.tokens_per_s:
            self.tokens_per_s = sample
        else:
            sample = min(sample, MAX_STEP * self.tokens_per_s)
            self.tokens_per_s = SMOOTHING * sample + (1 - SMOOTHING) * self.tokens_per_s

    def remaining(self, now: float) -> int:
        """The queued prefill tokens not yet done by `now`, by the rank's speed."""
        if not self._sent or not self.tokens_per_s:
            return self.tokens
        oldest = next(iter(self._sent.values()))  # sends are recorded in clock order
        done = self.tokens_per_s * (now - oldest)
        return max(self.tokens - int(done), 0)
