"""KeyAffinity: `prompt_cache_key` -> rank, sticky and bounded, for the gateway.

OpenAI routes requests by `prompt_cache_key`; so does the gateway: the first request of a key goes
where the policy sends it (cache_aware: where its prefix is cached), and every later request of the
key goes to the same rank, so the session's pages are found again. Load stays bounded: when the
key's rank is past the balance thresholds (its in-flight requests exceed the least-loaded rank's by
more than `balance_abs_threshold` and by a factor over `balance_rel_threshold`, SGLang's test) or is
not ready, the key moves to the rank the policy picks and stays there (it does not bounce back).

With `--policy cost` the key stays while its rank, taken to hold the session's history, costs no more
than the policy's pick (there the history is tokens to recompute): a move needs a queue on the session's
rank longer than the prompt another rank would compute; with `--session-affinity hard` it stays
on its rank while that rank is ready, whatever the load.

The sessions a rank is home to are load that has not arrived yet: each sends its next turn there. So the
gateway tells the policy how many keys each rank holds that sent a request within `SESSION_ACTIVE_S`
(`active_sessions`), and `cost` prices a new session's rank by them where they are more than its requests
in flight (policy.py): sessions spread by how many each rank serves, not by which happened to be between
turns when the new one arrived.

The key never crosses tenants: the map's key is (the request's Authorization header, its
cache_salt, the prompt_cache_key), hashed, the way a rank namespaces its pages by tenant and salt.
The map keeps the `MAX_KEYS` most recently used keys (LRU); a forgotten key is routed afresh.
Requests without a (string) key are left to the policy. The rank validates the key (400).
"""
from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from kvstrata.config_server import RouterConfig
from kvstrata.router.policy import Decision, RankLoad, overloaded
from kvstrata.serving.messages.cache_hints import session_key

MAX_KEYS = 65536
SESSION_ACTIVE_S = 300.0  # a key that sent a request this recently counts as its rank's load (Anthropic's cache TTL)


def affinity_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> bytes | None:
    """The tenant-scoped map key of a request, or None when it has no string prompt_cache_key (nor, from
    Claude Code, a session id: serving/messages/cache_hints.py, nor a `user`)."""
    key = body.get("prompt_cache_key")
    if not isinstance(key, str):  # Anthropic's clients name their session in a header or metadata.user_id
        metadata = body.get("metadata")
        key = session_key(headers, metadata if isinstance(metadata, Mapping) else None)
    if not isinstance(key, str) and isinstance(body.get("user"), str) and body["user"]:
        key = "user\x00" + body["user"]  # OpenAI's end-user id: one user's requests share their history
    if not isinstance(key, str):
        return None
    salt = body.get("cache_salt")
    auth = headers.get("authorization") or headers.get("x-api-key", "")
    parts = (auth, salt if isinstance(salt, str) else "", key)
    return hashlib.sha256("\x00".join(f"{len(p)}:{p}" for p in parts).encode()).digest()


class KeyAffinity:
    def __init__(self, cfg: RouterConfig, max_keys: int = MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.cfg = cfg
        self.max_keys = max_keys
        self._rank: OrderedDict[bytes, int] = OrderedDict()  # least recently used first
        self._seen: dict[bytes, float] = {}  # key -> when it last sent a request (monotonic seconds)
        self.moves = 0  # keys moved off an overloaded or unready rank

    def __len__(self) -> int:
        return len(self._rank)

    def active_sessions(self, now: float, exclude: bytes | None = None) -> dict[int, int]:
        """Keys per rank that sent a request within `SESSION_ACTIVE_S` of `now`, `exclude` (the asking
        session) left out. Read-only; walks from the most recent key to the first older one."""
        counts: dict[int, int] = {}
        for key in reversed(self._rank):
            if now - self._seen[key] > SESSION_ACTIVE_S:
                break
            if key != exclude:
                counts[self._rank[key]] = counts.get(self._rank[key], 0) + 1
        return counts

    def stays(self, load: RankLoad, ranks: Sequence[RankLoad], policy_choice: Decision,
              cost: Callable[[RankLoad], int] | None, prompt_tokens: int = 0) -> bool:
        if self.cfg.session_affinity == "hard":
            return True
        if cost is not None:  # soft, by cost: not dearer than the policy's pick, its own rank holding the
            # session's history (the rank's KV events may not have told of the last turn yet, and a prompt of
            # other text is still the session's: moving it is what costs its cache)
            pick = next((r for r in ranks if r.rank == policy_choice.rank), load)
            return cost(replace(load, match_tokens=max(load.match_tokens, prompt_tokens))) <= cost(pick)
        return not overloaded(load.requests, ranks, self.cfg)

    def route(self, key: bytes, ranks: Sequence[RankLoad], policy_choice: Decision, prompt_tokens: int = 0,
              cost: Callable[[RankLoad], int] | None = None, now: float | None = None) -> Decision:
        """The rank for `key` among the ready `ranks`: its sticky rank while it stays (`stays`), else
        `policy_choice` (which becomes the key's rank). `cost`: the cost policy's, when it routes. Changes
        state: records and refreshes the key (seen at `now`, monotonic seconds; default: the clock)."""
        self._seen[key] = time.monotonic() if now is None else now
        current = self._rank.get(key)
        load = next((r for r in ranks if r.rank == current), None)
        if load is not None and self.stays(load, ranks, policy_choice, cost, prompt_tokens):
            self._rank.move_to_end(key)
            return Decision(load.rank, "session", load.match_tokens / prompt_tokens if prompt_tokens > 0 else 0.0)
        if current is not None:
            self.moves += 1
        self._rank[key] = policy_choice.rank
        self._rank.move_to_end(key)
        while len(self._rank) > self.max_keys:
            self._seen.pop(self._rank.popitem(last=False)[0], None)
        reason = "session_moved" if current is not None else policy_choice.reason
        return Decision(policy_choice.rank, reason, policy_choice.match_ratio)
