"""`analyze(bodies, tokenizer)`: hit rate, sessions and the top divergences of a request log.

Achievable hit rate = for each request, the longest page-aligned prefix of its tokens that an
earlier request of the log already sent (never its last token), summed over the log, divided by
all prompt tokens: what a cache that never evicts could serve. Lost tokens = what each request
should have reused from its reference (grouping.py) and did not; `hit_rate_if_fixed` counts, per
request, the larger of its achievable tokens and what its reference should have shared. Divergences are grouped by (pattern, message, field) and ranked by lost tokens.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from kvstrata.analyze.divergence import Divergence, find_divergence
from kvstrata.analyze.grouping import group
from kvstrata.analyze.rendered import render
from kvstrata.bench.achievable import PrefixLedger

if TYPE_CHECKING:
    from kvstrata.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class Place:
    """One recurring divergence: a pattern at one message field, with an example."""

    pattern: str
    where: str  # "system message content", "user message content" or "template markup"
    count: int
    lost_tokens: int
    example: Divergence


@dataclass
class Analysis:
    requests: int
    prompt_tokens: int
    achievable_tokens: int
    fixed_tokens: int  # per request, the larger of achievable and what its reference should have shared
    lost_tokens: int
    sessions: int
    agents: int
    session_turns: dict[int, int]  # session id -> requests
    divergences: list[Divergence] = field(default_factory=list)
    places: list[Place] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.achievable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def hit_rate_if_fixed(self) -> float:
        return self.fixed_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def patterns(self) -> list[str]:
        return list(dict.fromkeys(p.pattern for p in self.places))

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "achievable_cached_tokens": self.achievable_tokens, "achievable_hit_rate": self.hit_rate,
            "lost_tokens": self.lost_tokens, "hit_rate_if_fixed": self.hit_rate_if_fixed,
            "sessions": self.sessions, "agents": self.agents,
            "places": [
                {
                    "pattern": p.pattern, "where": p.where, "count": p.count, "lost_tokens": p.lost_tokens,
                    "advice": p.example.advice, "detail": p.example.detail,
                    "example": {
                        "request": p.example.request, "reference": p.example.reference,
                        "reference_kind": p.example.reference_kind, "token_offset": p.example.token_offset,
                        "reference_text": p.example.before, "request_text": p.example.after,
                    },
                }
                for p in self.places
            ],
        }


def _where(d: Divergence) -> str:
    loc = d.location
    return "template markup" if loc.message is None else f"{loc.role} message {loc.field}"


def analyze(bodies: Sequence[dict[str, Any]], tokenizer: Tokenizer, page_size: int = 16, top: int = 5) -> Analysis:
    rendered = [render(tokenizer, body, i) for i, body in enumerate(bodies)]
    grouping = group(rendered)
    ledger = PrefixLedger(page_size)
    achievable: list[int] = []
    for r in rendered:
        achievable.append(ledger.match(r.ids))
        ledger.add(r.ids)
    divergences = [
        d for r, ref in zip(rendered, grouping.references)
        if ref is not None and (d := find_divergence(r, rendered[ref.index], ref)) is not None
    ]
    buckets: dict[tuple[str, str], list[Divergence]] = defaultdict(list)
    for d in divergences:
        buckets[(d.pattern, _where(d))].append(d)
    places = sorted(
        (Place(p, w, len(ds), sum(d.lost_tokens for d in ds), ds[0]) for (p, w), ds in buckets.items()),
        key=lambda p: -p.lost_tokens,
    )
    fixed = list(achievable)  # had the reference's shared part been kept: at least that much
    for r, ref in zip(rendered, grouping.references):
        if ref is not None:
            fixed[r.index] = max(fixed[r.index], min(ref.shared_tokens, len(r.ids) - 1))
    turns: dict[int, int] = defaultdict(int)
    for s in grouping.session_of:
        turns[s] += 1
    return Analysis(
        requests=len(rendered), prompt_tokens=sum(len(r.ids) for r in rendered), achievable_tokens=sum(achievable),
        fixed_tokens=sum(fixed), lost_tokens=sum(d.lost_tokens for d in divergences), sessions=grouping.num_sessions,
        agents=grouping.num_agents, session_turns=dict(turns), divergences=divergences, places=places[:top],
    )


def format_analysis(a: Analysis) -> str:
    lengths = sorted(a.session_turns.values())
    lines = [
        f"requests            {a.requests}",
        f"prompt tokens       {a.prompt_tokens:,}",
        f"achievable hit rate {a.hit_rate:.1%}  ({a.achievable_tokens:,} tokens a never-evicting cache could serve)",
        f"sessions            {a.sessions}  (requests per session: min {lengths[0]}, max {lengths[-1]})"
        if lengths else "sessions            0",
        f"agents              {a.agents}  (distinct system prompts, ignoring digits and line order)",
        f"lost to divergences {a.lost_tokens:,} tokens; hit rate if fixed ~{a.hit_rate_if_fixed:.1%}",
    ]
    if not a.places:
        lines.append("\nno divergences: every request reuses all of its session's and agent's earlier prompt")
    for n, p in enumerate(a.places, 1):
        d = p.example
        lines += [
            "",
            f"{n}. {p.pattern} at {p.where}: {p.count} requests, {p.lost_tokens:,} tokens lost",
            f"   {d.detail}",
            f"   e.g. request {d.request} vs {d.reference_kind} reference {d.reference}, token offset {d.token_offset}"
            f" ({d.location.describe()})",
            f"   before: {d.before}",
            f"   now:    {d.after}",
            f"   advice: {d.advice}",
        ]
    return "\n".join(lines)
