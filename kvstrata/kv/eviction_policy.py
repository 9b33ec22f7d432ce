"""Which cached pages go first: the eviction order of L1 (radix.py) and L2 (host_tier.py).

Every cached page has a class:

    PROBATION  0  seen once (inserted by a request that reused little of its prompt)
    PROTECTED  1  reused: a later request hit it, or it continues a prompt that was mostly a hit
    RETAINED   2  its request sent prompt_cache_retention "24h" (or an Anthropic cache_control breakpoint
               covered it: 5 minutes or 1 hour) and the retention has not expired

`--eviction-policy`:
- `lru`: recency only; PROBATION and PROTECTED are the same (RETAINED still counts: the
  client asked for it).
- `slru` (the default): segmented LRU. Every PROBATION page goes before any PROTECTED page, which goes
  before any RETAINED page; LRU within a class. A one-off prompt (a batch job, a crawler, a
  summarisation sweep) reuses nothing, so its pages stay PROBATION and cannot flush the prefixes
  sessions come back to. A session's next turn reuses its history, so the pages it adds start
  PROTECTED: its growing prefix survives a scan between turns without ever being hit twice first.
  Chosen by measurement: bench/scan_policy_sim.py (docs/kv-tiers.md, "Scan resistance").

L2 keeps the classes of the pages L1 evicts into it (host_tier.py): PROBATION first, then
PROTECTED (at most PROTECTED_SHARE of L2: past it the least recent protected page is demoted); RETAINED pages younger than their retention are never evicted by other traffic while
they are within `--prompt-cache-retention-quota` of L2 (past it the oldest RETAINED page is the victim).
"""
from __future__ import annotations

import time

POLICIES = ("lru", "slru")
PROBATION, PROTECTED, RETAINED = 0, 1, 2
CLASS_NAMES = ("probation", "protected", "retained")
# seconds a retained page outlives other traffic: OpenAI's prompt_cache_retention, Anthropic's cache_control ttl
RETENTION_S = {"in_memory": 0.0, "24h": 24 * 3600.0, "5m": 300.0, "1h": 3600.0}
_SPAN = 1 << 48  # clock units between classes: a class outranks any recency of the class below

# a request whose cache hit covers at least this share of its prompt is a continuation: the pages
# it adds start PROTECTED (a session turn). A one-off prompt hits at most a shared template page.
CONTINUATION_SHARE = 0.5
# L2's protected segment holds at most this share of L2; past it its least recent page goes back to
# probation (segmented LRU), so sessions that ended cannot freeze L2
PROTECTED_SHARE = 0.8


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise ValueError(f"--eviction-policy must be one of {list(POLICIES)}, got {name!r}")
    return name


def check_quota(quota: float) -> float:
    if isinstance(quota, bool) or not isinstance(quota, (int, float)) or not 0.0 <= quota <= 1.0:
        raise ValueError(f"--prompt-cache-retention-quota must be a share of L2 in [0, 1], got {quota!r}")
    return float(quota)


def now() -> float:
    """Retention clock: wall time, so a 24-hour lifetime means the same in L1, L2 and L3."""
    return time.time()


def insert_class(policy: str, retention: str, cached_tokens: int, prompt_tokens: int) -> int:
    """The class of the pages a request adds to the cache."""
    if RETENTION_S.get(retention, 0.0) > 0:
        return RETAINED
    if policy == "slru" and prompt_tokens > 0 and cached_tokens >= CONTINUATION_SHARE * prompt_tokens:
        return PROTECTED
    return PROBATION


def hit_class(policy: str, cls: int) -> int:
    """A page's class after a request hit it."""
    return max(cls, PROTECTED) if policy == "slru" else cls


def effective_class(policy: str, cls: int, retain_until: float, at: float) -> int:
    """The class that orders eviction now: RETAINED lapses to PROTECTED once its time is up."""
    if cls == RETAINED and retain_until <= at:
        cls = PROTECTED
    if policy == "lru" and cls == PROTECTED:
        return PROBATION
    return cls


def priority(policy: str, cls: int, retain_until: float, last_access: int, at: float) -> int:
    """L1 heap key: lower goes first."""
    return effective_class(policy, cls, retain_until, at) * _SPAN + last_access
