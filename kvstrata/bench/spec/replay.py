"""Draft sources replayed over recorded replies: what a verify step would emit, with no timing noise.

A recorded request is its tenant, its prompt's token ids and the greedy reply the model wrote without
drafts. Replaying a draft source over it: at each step the source proposes up to k tokens after the
context (the prompt and the reply so far; the reply's first token comes from the prompt's step, without
drafts, as in the engine); the step keeps the longest prefix of the draft that equals the
recorded reply and emits it and the model's own next token, as a greedy verify step does. Each request's
reply then joins what the source knows (its tenant's outputs) before the next request starts, as the
engine's does when a request finishes. Reported per source: decode steps, tokens per decode step (decode's
speed-up if verifying drafts cost nothing, the ceiling any timing can show), drafted and accepted tokens,
the source's own time a step, and its time when a request ends (per 1,000 output tokens).

The same sources the engine runs (`RequestDrafter` in the `suffix` and `ngram` modes, their whole drafts,
no cost model), or any object with `start`, `propose`, `emitted` and `finish`
(bench/draft_replay.py adds arctic-inference's `SuffixDecodingCache`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from kvstrata.engine.spec.drafter import RequestDrafter, SpecConfig, TenantOutputs


@dataclass(frozen=True)
class Recorded:
    kind: str  # the workload's kind of session (code, json, tool)
    tenant: str
    prompt: list[int]
    output: list[int]


class DraftSource(Protocol):
    name: str

    def start(self, rid: int, tenant: str, prompt: list[int]) -> None: ...

    def propose(self, rid: int, context: list[int], k: int) -> list[int]: ...

    def emitted(self, rid: int, tokens: list[int]) -> None: ...

    def finish(self, rid: int) -> None: ...


class KvstrataSource:
    """The engine's drafter: `suffix` (the request's own tokens and its tenant's outputs) or `ngram` (its own)."""

    def __init__(self, mode: str = "suffix", max_tokens: int = 16, end_ids: Sequence[int] = ()) -> None:
        """`end_ids`: the model's EOS tokens, as the engine passes them."""
        if mode not in ("suffix", "ngram"):
            raise ValueError(f"mode must be suffix or ngram, got {mode!r}")
        self.name = f"kvstrata-{mode}"
        self.mode = mode
        # as the explicit modes: no giving up
        self.config = SpecConfig(max_tokens=max_tokens, disable_below=0.0, end_ids=frozenset(end_ids))
        self.outputs = TenantOutputs(self.config)
        self._drafters: dict[int, RequestDrafter] = {}

    def start(self, rid: int, tenant: str, prompt: list[int]) -> None:
        self._drafters[rid] = RequestDrafter(prompt, tenant, self.outputs, self.config)

    def propose(self, rid: int, context: list[int], k: int) -> list[int]:
        return list(self._drafters[rid].propose(k).tokens)

    def emitted(self, rid: int, tokens: list[int]) -> None:
        self._drafters[rid].append(tokens)

    def finish(self, rid: int) -> None:
        d = self._drafters.pop(rid)
        if self.mode == "suffix":
            d.finish()


@dataclass
class Replayed:
    """One request replayed by one source."""

    kind: str
    output_tokens: int = 0
    steps: int = 0  # decode steps: after the first token
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0  # time in the source's propose and emitted calls
    finish_s: float = 0.0  # time in its finish call (the engine's: when the request ends, on the engine thread)


def replay_request(source: DraftSource, rid: int, req: Recorded, k: int) -> Replayed:
    """`req` through `source`, drafts of at most k tokens (never past the reply's end: the last token is the
    model's own, as max_tokens leaves it)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    out = Replayed(req.kind, output_tokens=len(req.output))
    source.start(rid, req.tenant, list(req.prompt))
    context = list(req.prompt) + req.output[:1]
    if req.output:
        source.emitted(rid, req.output[:1])
    t = len(req.output[:1])
    while t < len(req.output):
        cap = min(k, len(req.output) - t - 1)
        began = time.perf_counter()
        draft = source.propose(rid, context, cap)[:cap] if cap > 0 else []
        out.draft_s += time.perf_counter() - began
        rest = req.output[t:t + len(draft)]
        kept = next((i for i, (x, y) in enumerate(zip(draft, rest)) if x != y), len(rest))  # the kept prefix
        emitted = req.output[t:t + kept + 1]
        began = time.perf_counter()
        source.emitted(rid, emitted)
        out.draft_s += time.perf_counter() - began
        context.extend(emitted)
        t += len(emitted)
        out.steps += 1
        if draft:
            out.drafted += len(draft)
            out.accepted += kept
    began = time.perf_counter()
    source.finish(rid)
    out.finish_s = time.perf_counter() - began
    return out


def replay(source: DraftSource, requests: Sequence[Recorded], k: int = 16) -> list[Replayed]:
    """Every request in order, each finished before the next starts (one agent at a time)."""
    return [replay_request(source, rid, req, k) for rid, req in enumerate(requests)]


def summary(rows: Sequence[Replayed]) -> dict[str, float]:
    steps = sum(r.steps for r in rows)
    drafted = sum(r.drafted for r in rows)
    out = sum(r.output_tokens for r in rows)
    decoded = sum(max(0, r.output_tokens - 1) for r in rows)  # the first token of each is the prompt step's
    return {"requests": len(rows), "output_tokens": out, "steps": steps,
            "tokens_per_step": decoded / steps if steps else 0.0, "drafted": drafted,
            "accepted": sum(r.accepted for r in rows),
            "acceptance": sum(r.accepted for r in rows) / drafted if drafted else 0.0,
            "us_per_step": 1e6 * sum(r.draft_s for r in rows) / steps if steps else 0.0,
            "finish_ms_per_1k_tokens": 1e6 * sum(r.finish_s for r in rows) / out if out else 0.0}
