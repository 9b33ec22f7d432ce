"""`kvstrata bench fleet`'s workload and figures: N agent sessions sharing one long prefix (the system
prompt and tools every session of a deployment sends), joining a few seconds apart, then running
their turns concurrently; each turn resends the whole history.

The figures (`fleet_figures`) are computed from what the run recorded, per request: the rank that
answered (the gateway's `x-kvstrata-rank`), its TTFT, and its cached tokens against the achievable
(bench/achievable.py's `achievable_tokens`: whole pages of what any earlier request had left in a
cache by the time this one was sent, as one rank with an unbounded cache would hold them).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from kvstrata.bench.args import check_ranges
from kvstrata.bench.client import RequestRecord
from kvstrata.bench.report import percentile
from kvstrata.bench.text import prose


@dataclass(frozen=True)
class FleetConfig:
    sessions: int = 8
    prefix_tokens: int = 4096
    turns: int = 6
    turn_tokens: int = 64  # each user message
    join_gap_s: float = 3.0  # between two sessions' first requests
    max_tokens: int = 32
    seed: int = 0

    def validate(self) -> None:
        check_ranges([("--sessions", self.sessions, 1, 256), ("--prefix-tokens", self.prefix_tokens, 64, 32768),
                      ("--turns", self.turns, 1, 64), ("--turn-tokens", self.turn_tokens, 8, 4096),
                      ("--max-tokens", self.max_tokens, 1, 4096)])
        if not 0 <= self.join_gap_s <= 600:
            raise ValueError(f"--join-gap must be in [0, 600] seconds (got {self.join_gap_s})")


class FleetWorkload:
    """The shared system prompt and each session's user messages, fixed by the seed."""

    def __init__(self, config: FleetConfig) -> None:
        config.validate()
        self.config = config
        rng = random.Random(config.seed)
        self.system = f"You are a coding agent. {prose(rng, config.prefix_tokens)}"
        self.questions = [[f"Session {s}, step {t}: {prose(rng, config.turn_tokens)}" for t in range(config.turns)]
                          for s in range(config.sessions)]

    def messages(self, session: int, replies: Sequence[str]) -> list[dict[str, str]]:
        """Turn len(replies) of `session`: the shared system prompt, then its history."""
        out = [{"role": "system", "content": self.system}]
        for turn, question in enumerate(self.questions[session][: len(replies) + 1]):
            out.append({"role": "user", "content": question})
            if turn < len(replies):
                out.append({"role": "assistant", "content": replies[turn]})
        return out


def fleet_figures(records: Sequence[RequestRecord], achievable: Sequence[int], ranks: int,
                  duration_s: float) -> dict[str, Any]:
    """Per-rank share, hit efficiency (cached over `achievable`, `achievable_tokens`' per request),
    TTFT p50/p99 of first and later turns, errors, duration."""
    ok = [(r, a) for r, a in zip(records, achievable) if r.result.ok]
    share = [sum(1 for r, _ in ok if r.result.rank == k) / len(ok) if ok else 0.0 for k in range(ranks)]
    cached = sum(r.result.cached_tokens or 0 for r, _ in ok)
    possible = sum(a for _, a in ok)
    first = [r.result.ttft_s for r, _ in ok if r.turn == 0 and r.result.ttft_s is not None]
    later = [r.result.ttft_s for r, _ in ok if r.turn > 0 and r.result.ttft_s is not None]

    def pct(xs: list[float], q: float) -> float | None:
        v = percentile(xs, q)
        return None if v is None else round(v, 4)

    return {
        "requests": len(records), "errors": len(records) - len(ok),
        "rank_share": [round(x, 3) for x in share], "smallest_rank_share": round(min(share), 3) if share else 0.0,
        "cached_tokens": cached, "achievable_tokens": possible,
        "hit_efficiency": round(cached / possible, 4) if possible else None,
        "first_ttft_p50_s": pct(first, 50), "first_ttft_p99_s": pct(first, 99),
        "later_ttft_p50_s": pct(later, 50), "later_ttft_p99_s": pct(later, 99),
        "duration_s": round(duration_s, 2),
    }
