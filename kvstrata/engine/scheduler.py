"""Scheduler: continuous batching with chunked prefill, a token budget, two prefill policies and preemption.

Each step first gives every decoding request its next token (decode rows stay in every step), then spends
what is left of `max_num_batched_tokens` on prompts in the policy's order: the first takes as much as it
needs, the next one the rest, so prompts finish one after another instead of each advancing by a chunk and
all finishing late; only what does not fit is chunked (`chunked_prefill_size`, default none, caps one
request's share). Waiting requests are admitted in that order too while pages, the budget and `max_num_seqs`
allow.
- `fcfs`: running prompts, then waiting ones, each by priority then arrival; steps sized by tokens alone.
- `slo` (the default): running and waiting prompts together in prefill_plan.py's order (the most first tokens
  within `ttft_target_ms`, late ones yield, aged ones go first), and while requests decode a step takes only
  the prefill that keeps its predicted time (step_timer.py, learnt from the steps run) within `tpot_target_ms`.
A request whose prefix is being prefetched from L3 (`KVCacheManager.ready`) keeps its place while the ones
behind it go on; with the prefix cache on, so does one whose prompt shares pages that a running request is
still prefilling, until they are cached (prefill_dedup.py: computed once). When a running request cannot get
pages, the lowest-priority, most recently admitted request is preempted by recompute: its pages go back (its
computed full pages stay in the prefix cache) and it re-enters the queue with its generated tokens, so it
resumes and finishes with the same output.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from kvstrata.config import SchedulerConfig
from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.prefill_dedup import follows_inflight_prefill
from kvstrata.engine.request import Request, RequestStatus
from kvstrata.engine.slo_policy import MIN_STEP_PREFILL, SloPolicy
from kvstrata.engine.step_timer import StepShape, StepTimer, chunk_pairs


@dataclass
class ScheduledBatch:
    requests: list[Request] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)  # new tokens computed for each request, drafts included
    drafts: dict[int, list[int]] = field(default_factory=dict)  # request index -> drafted tokens it verifies

    def __len__(self) -> int:
        return len(self.requests)

    def draft(self, i: int) -> list[int]:
        """The tokens drafted after request i's last token (engine/spec/), verified in this step."""
        return self.drafts.get(i, [])

    def shape(self) -> StepShape:
        """The batch's features for the step timer (before the step: tokens computed so far)."""
        rows = tokens = context = 0
        pairs = 0.0
        for i, (r, n) in enumerate(zip(self.requests, self.num_tokens)):
            own = n - len(self.draft(i))
            if own > 1:
                tokens += own
                pairs += chunk_pairs(r.num_computed_tokens, own)
            else:
                rows += n
                context += r.num_computed_tokens
        return StepShape(rows, tokens, pairs, context)

    def samples(self, i: int) -> bool:
        """Whether request i reaches the end of its known tokens this step (so it samples)."""
        r = self.requests[i]
        return r.num_computed_tokens + self.num_tokens[i] - len(self.draft(i)) == r.num_tokens


@dataclass
class _Step:
    """One schedule() call's state."""

    batch: ScheduledBatch
    budget: int  # tokens left
    seconds: float | None = None  # prefill time left (slo, with decode rows); None: tokens alone
    prefill_tokens: int = 0  # prompt tokens taken so far
    preempted: set[Request] = field(default_factory=set)
    finishing: bool = False  # a prompt finishes its prefill in this step
    closed: bool = False  # ... and another's partial chunk was held back: no more prefills
    admitting: bool = True  # a waiting request did not fit: none after it is admitted this step


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager) -> None:
        self.cfg = cfg
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.dedup_prefill = cfg.dedup_prefill and kv.cache is not None
        self.timer = StepTimer()  # fed by the engine after every step under slo
        self.slo = SloPolicy(cfg, kv, self.timer) if cfg.scheduling_policy == "slo" else None

    def can_add(self) -> bool:
        """Whether the waiting queue has room (`max_queue_requests`); preempted requests skip this."""
        return len(self.waiting) < self.cfg.max_queue_requests

    def add(self, req: Request) -> None:
        """Queue behind every waiting request of the same or a higher priority (lower value): FCFS within a
        priority."""
        self._queue(req, (req.params.priority, 1, req.stats.arrival))

    def _queue(self, req: Request, key: tuple[int, int, float]) -> None:
        at = len(self.waiting)
        while at > 0 and self._waiting_key(self.waiting[at - 1]) > key:
            at -= 1
        self.waiting.insert(at, req)

    @staticmethod
    def _waiting_key(req: Request) -> tuple[int, int, float]:
        """(priority, 0 for a preempted request: it goes back ahead of its priority's new ones, arrival)."""
        return (req.params.priority, 0 if req.admitted_once else 1, req.stats.arrival)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk(self, req: Request, s: _Step) -> int:
        """Tokens `req` computes in the step: what it needs, within the chunk size, the step's tokens and (a
        prompt, under slo) the step's prefill time."""
        n = min(req.num_uncomputed, self.cfg.chunked_prefill_size or s.budget, s.budget)
        if n > 1 and s.seconds is not None:  # the step's first prompt chunk gets at least MIN_STEP_PREFILL tokens
            floor = 0 if s.prefill_tokens else MIN_STEP_PREFILL
            n = min(n, max(floor, self.timer.prefill_tokens_within(s.seconds, req.num_computed_tokens)))
        return n

    def _holds_back(self, req: Request, n: int, finishing: bool) -> bool:
        """Finish-first: once a prompt finishes its prefill in this step, no other prompt starts a
        partial chunk in it (prompts that finish in it too still join). The chunk would hold back the
        finishing prompt's first token by its compute and bring the next prompt's no sooner: that
        prompt's tokens run in the following steps either way."""
        return finishing and self.cfg.prefill_finish_first and n < req.num_uncomputed

    @staticmethod
    def _finishes(req: Request, n: int) -> bool:
        return req.num_uncomputed > 1 and n == req.num_uncomputed  # a prefill that reaches its first token

    def _preempt(self, req: Request) -> None:
        self.kv.release(req)
        req.status = RequestStatus.WAITING
        self._queue(req, self._waiting_key(req))
        self.num_preemptions += 1

    def _victim(self) -> Request:
        """The running request to preempt when pages run short: the lowest priority (highest value), the most
        recently admitted of those."""
        i = max(range(len(self.running)), key=lambda i: (self.running[i].params.priority, i))
        return self.running.pop(i)

    def schedule(self) -> ScheduledBatch:
        s = _Step(ScheduledBatch(), self.cfg.max_num_batched_tokens)
        for req in [r for r in self.running if r.num_uncomputed == 1]:  # decode rows first, in running order
            if req in s.preempted:  # a victim of an earlier row's pages
                continue
            if s.budget <= 0 or not self._run(s, req, 1):
                break
        prefilling = [r for r in self.running if r.num_uncomputed > 1]
        if self.slo is None:  # fcfs: running prompts, then waiting ones (each by priority, then arrival)
            order = sorted(prefilling, key=lambda r: (r.params.priority, r.stats.arrival)) + list(self.waiting)
        else:
            order, s.seconds = self.slo.plan(s.batch, prefilling, list(self.waiting))
        for req in order:
            if s.budget <= 0 or s.closed or (s.prefill_tokens and s.seconds is not None and s.seconds <= 0):
                break
            if req.status is RequestStatus.RUNNING:
                if req in s.preempted:
                    continue
                n = self._chunk(req, s)
                if n <= 0:
                    break
                if self._holds_back(req, n, s.finishing):
                    s.closed = True
                elif not self._run(s, req, n):
                    break
            elif s.admitting and not s.preempted and len(self.running) < self.cfg.max_num_seqs:
                self._admit(s, req)
        return s.batch

    def _run(self, s: _Step, req: Request, n: int) -> bool:
        """Give running `req` n tokens of the step, preempting others (or itself) for pages; False once it
        was preempted itself: the step takes nothing more."""
        while not self.kv.can_allocate(req, n):
            victim = self._victim()  # scheduled this step or not
            if victim in s.batch.requests:
                j = s.batch.requests.index(victim)
                del s.batch.requests[j]
                s.budget += s.batch.num_tokens.pop(j)
            self._preempt(victim)
            s.preempted.add(victim)
            if victim is req:
                return False
        self._take(s, req, n)
        return True

    def _admit(self, s: _Step, req: Request) -> None:
        """Admit waiting `req` into the step if it may start now; a request whose prefix is coming from L3 or
        being prefilled by another keeps its place while the ones behind it go on; one that does not fit stops
        admission for this step."""
        if not self.kv.ready(req) or (self.dedup_prefill and follows_inflight_prefill(req, self.running, self.kv.page_size)):
            return
        hit = self.kv.admit(req)  # waiting requests hold no pages
        n = self._chunk(req, s)
        held = self._holds_back(req, n, s.finishing)
        if held or n <= 0 or not self.kv.can_allocate(req, n):
            self.kv.release(req)  # give the lock back; try again next step
            s.admitting = False
            s.closed = s.closed or held
            return
        self.waiting.remove(req)
        if self.slo is not None:
            self.slo.forget(req)
        if not req.admitted_once:
            req.admitted_once = True
            req.stats.cached_tokens = hit.tokens
            req.stats.tier_tokens.update(hit.by_tier())
        if req.stats.scheduled is None:
            req.stats.scheduled = time.monotonic()
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self._take(s, req, n)

    def _take(self, s: _Step, req: Request, n: int) -> None:
        if req.num_uncomputed > 1:
            s.prefill_tokens += n
            if s.seconds is not None:
                s.seconds -= self.timer.prefill_seconds(req.num_computed_tokens, n)
        s.finishing = s.finishing or self._finishes(req, n)
        self.kv.allocate(req, n)
        s.batch.requests.append(req)
        s.batch.num_tokens.append(n)
        s.budget -= n

    def advance(self, req: Request, n: int) -> None:
        """Mark `n` more of the request's tokens computed (their K/V is in its pages; a verify step's
        rejected drafts are not among them) and hand its newly full pages to the prefix cache."""
        req.num_computed_tokens += n
        assert req.num_computed_tokens <= req.num_tokens, (req.num_computed_tokens, req.num_tokens)
        self.kv.commit(req)

    def finish(self, req: Request, reason: str) -> None:
        """Remove a request wherever it is and give back its pages."""
        if req.finished:
            return
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if self.slo is not None:
            self.slo.forget(req)
        self.kv.release(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stats.finished = time.monotonic()

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running)
