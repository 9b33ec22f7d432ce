"""Routing policies: given each ready rank's load (and cached match), which rank gets a request.

| policy        | picks                                                                           |
|---------------|---------------------------------------------------------------------------------|
| round_robin   | the next rank in turn                                                           |
| least_load    | the fewest in-flight tokens (then requests; exact ties rotate)                  |
| cache_aware   | balanced and best match > threshold: longest match (ties: least loaded);        |
|               | otherwise the least-loaded rank, never "the smallest tree" regardless of load    |
| cost          | the least predicted time to first token: prefill tokens already queued there +  |
|               | this prompt's tokens not cached there + decode_cost_tokens a request in flight  |
|               | (or a session homed there, where those are more: key_affinity.py)                |

"Balanced" is SGLang router's test on in-flight requests: the loads are unbalanced when
`max - min > balance_abs_threshold` and `max > min * balance_rel_threshold`.
`cost` scores what SGLang's match-then-balance cannot see. A prefix many conversations share (a fleet's
system prompt and tools; shared_prefix.py finds it) is priced as held on every rank: computing it once
more on an idle rank is a one-off every later session there reuses, so new sessions spread by load
instead of piling onto the rank that computed it first. A session's own history is the tokens another
rank would recompute, so it stays while its rank is not slower by more than that. Costs are in prompt
tokens (a prefill's time is about linear in its uncached tokens).
Policies are pure: no I/O, no clocks; the gateway gives them `RankLoad`s and records the Decision.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from kvstrata.config_server import RouterConfig


@dataclass(frozen=True)
class RankLoad:
    rank: int
    requests: int = 0  # in flight through the gateway
    tokens: int = 0  # prompt + max_tokens of those requests
    match_tokens: int = 0  # prompt tokens this rank already holds in its prefix cache
    prefill_tokens: int = 0  # uncached prompt tokens of requests sent there that have not begun to answer
    sessions: int = 0  # other sessions homed there that sent a request lately (KeyAffinity.active_sessions)


@dataclass(frozen=True)
class Decision:
    rank: int
    reason: str  # round_robin | least_load | cache_match | cache_miss | imbalanced | cost (| gateway's own)
    match_ratio: float = 0.0  # the chosen rank's cached share of the prompt


def overloaded(requests: int, ranks: Sequence[RankLoad], cfg: RouterConfig) -> bool:
    """SGLang router's imbalance test: `requests` in flight are too many beside the least loaded rank's."""
    lo = min(r.requests for r in ranks)
    return requests - lo > cfg.balance_abs_threshold and requests > lo * cfg.balance_rel_threshold


class Policy:
    name = "base"
    needs_match = False  # whether the gateway must tokenize and match the prompt
    needs_sessions = False  # whether the gateway must count the sessions homed on each rank (RankLoad.sessions)

    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self._turn = 0  # rotation for round robin and for exact ties

    def choose(self, ranks: Sequence[RankLoad], prompt_tokens: int, shared_tokens: int = 0) -> Decision:
        """`shared_tokens`: the prompt's leading tokens that many conversations share (shared_prefix.py)."""
        raise NotImplementedError

    def least_loaded(self, ranks: Sequence[RankLoad]) -> RankLoad:
        """Fewest in-flight tokens, then requests; exact ties go to the next rank in rotation."""
        n = max(r.rank for r in ranks) + 1
        best = min(ranks, key=lambda r: (r.tokens, r.requests, (r.rank - self._turn) % n))
        self._turn = best.rank + 1
        return best

    def session_cost(self, prompt_tokens: int, shared_tokens: int = 0) -> Callable[[RankLoad], int] | None:
        """A rank's cost for this prompt, when the policy routes by cost: a session then stays on its rank
        while that is not dearer (key_affinity.py); None: it stays while its rank is not overloaded."""
        return None

    @staticmethod
    def ratio(rank: RankLoad, prompt_tokens: int) -> float:
        return rank.match_tokens / prompt_tokens if prompt_tokens > 0 else 0.0


class RoundRobin(Policy):
    name = "round_robin"

    def choose(self, ranks: Sequence[RankLoad], prompt_tokens: int, shared_tokens: int = 0) -> Decision:
        ordered = sorted(ranks, key=lambda r: r.rank)
        pick = next((r for r in ordered if r.rank >= self._turn), ordered[0])
        self._turn = pick.rank + 1
        return Decision(pick.rank, self.name, self.ratio(pick, prompt_tokens))


class LeastLoad(Policy):
    name = "least_load"

    def choose(self, ranks: Sequence[RankLoad], prompt_tokens: int, shared_tokens: int = 0) -> Decision:
        pick = self.least_loaded(ranks)
        return Decision(pick.rank, self.name, self.ratio(pick, prompt_tokens))


class CacheAware(Policy):
    name = "cache_aware"
    needs_match = True

    def balanced(self, ranks: Sequence[RankLoad]) -> bool:
        return not overloaded(max(r.requests for r in ranks), ranks, self.cfg)

    def choose(self, ranks: Sequence[RankLoad], prompt_tokens: int, shared_tokens: int = 0) -> Decision:
        if not self.balanced(ranks):
            pick = self.least_loaded(ranks)
            return Decision(pick.rank, "imbalanced", self.ratio(pick, prompt_tokens))
        longest = max(r.match_tokens for r in ranks)
        if prompt_tokens > 0 and longest / prompt_tokens > self.cfg.cache_threshold:
            pick = self.least_loaded([r for r in ranks if r.match_tokens == longest])
            return Decision(pick.rank, "cache_match", self.ratio(pick, prompt_tokens))
        pick = self.least_loaded(ranks)
        return Decision(pick.rank, "cache_miss", self.ratio(pick, prompt_tokens))


class CostAware(Policy):
    name = "cost"
    needs_match = True
    needs_sessions = True

    def cost(self, rank: RankLoad, prompt_tokens: int, shared_tokens: int = 0) -> int:
        """Predicted time to first token there, in prompt tokens, the shared prefix priced as held there."""
        uncached = max(prompt_tokens - max(rank.match_tokens, shared_tokens), 0)
        # a session homed there sends its next turn there: load to come, where it is more than what is in flight
        return rank.prefill_tokens + uncached + self.cfg.decode_cost_tokens * max(rank.requests, rank.sessions)

    def session_cost(self, prompt_tokens: int, shared_tokens: int = 0) -> Callable[[RankLoad], int] | None:
        return lambda r: self.cost(r, prompt_tokens, shared_tokens)

    def choose(self, ranks: Sequence[RankLoad], prompt_tokens: int, shared_tokens: int = 0) -> Decision:
        costs = {r.rank: self.cost(r, prompt_tokens, shared_tokens) for r in ranks}
        low = min(costs.values())
        pick = self.least_loaded([r for r in ranks if costs[r.rank] == low])
        return Decision(pick.rank, "cost", self.ratio(pick, prompt_tokens))


POLICIES: dict[str, Callable[[RouterConfig], Policy]] = {
    "round_robin": RoundRobin,
    "least_load": LeastLoad,
    "cache_aware": CacheAware,
    "cost": CostAware,
}


def make_policy(cfg: RouterConfig) -> Policy:
    try:
        return POLICIES[cfg.policy](cfg)
    except KeyError:
        raise ValueError(f"unknown routing policy {cfg.policy!r}; choose one of {sorted(POLICIES)}") from None
