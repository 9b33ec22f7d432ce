"""Scheduler: continuous batching with chunked prefill, a token budget, FCFS and preemption.

Each step first gives every decoding request its next token (decode rows stay in every step),
then spends what is left of `max_num_batched_tokens` on prefills first-come-first-served: the
oldest prefilling request (by arrival) takes as much as it needs, the next one the rest, so the
earliest prompt finishes first instead of every prompt advancing by a chunk and all finishing
late; only what does not fit is chunked (`chunked_prefill_size`, default none, caps one request's
share). Then it admits waiting requests first-come-first-served while pages, the budget and
`max_num_seqs` allow; a request whose prefix is
being prefetched from L3 (`KVCacheManager.ready`) keeps its place while the ones behind it go on. When a running request
cannot get pages, the most recently admitted request is preempted by recompute: its pages go back
(its computed full pages stay in the prefix cache) and it re-enters the front of the queue with
its generated tokens, so it resumes and finishes with the same output.
With the prefix cache on, a waiting request whose prompt shares pages that a running request is
still prefilling also keeps its place until they are cached (prefill_dedup.py: computed once).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from kvstrata.config import SchedulerConfig
from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.prefill_dedup import follows_inflight_prefill
from kvstrata.engine.request import Request, RequestStatus


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

    def samples(self, i: int) -> bool:
        """Whether request i reaches the end of its known tokens this step (so it samples)."""
        r = self.requests[i]
        return r.num_computed_tokens + self.num_tokens[i] - len(self.draft(i)) == r.num_tokens


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager) -> None:
        self.cfg = cfg
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.dedup_prefill = cfg.dedup_prefill and kv.cache is not None

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

    def _chunk(self, req: Request, budget: int) -> int:
        return min(req.num_uncomputed, self.cfg.chunked_prefill_size or budget, budget)

    def _holds_back(self, req: Request, n: int, finishing: bool) -> bool:
        """Finish-first: once a prompt finishes its prefill in this step, no other prompt starts a
        partial chunk in it (prompts that finish in it too still join). The chunk would hold back the
        finishing prompt's first token by its compute and bring the next prompt's no sooner: that
        prompt's tokens run in the following steps either way."""
        return finishing and self.cfg.prefill_finish_first and n < req.num_uncomputed

    @staticmethod
    def _finishes(req: Request, n: int) -> bool:
        return req.num_uncomputed > 1 and n == req.num_uncomputed  # a prefill that reaches its first token

    @staticmethod
    def _order(req: Request) -> tuple[int, int, float]:
        """Decode rows (one token left to compute) first, then prefills by priority, oldest-arrival first."""
        return (0, 0, 0.0) if req.num_uncomputed == 1 else (1, req.params.priority, req.stats.arrival)

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
        batch = ScheduledBatch()
        budget = self.cfg.max_num_batched_tokens
        preempted: set[Request] = set()
        finishing = closed = False  # a prompt finishes in this step; no more prefills join it
        for req in sorted(self.running, key=self._order):
            if budget <= 0:
                break
            if req in preempted:
                continue
            n = self._chunk(req, budget)
            if self._holds_back(req, n, finishing):
                closed = True
                break
            while not self.kv.can_allocate(req, n):
                victim = self._victim()  # scheduled this step or not
                if victim in batch.requests:
                    j = batch.requests.index(victim)
                    del batch.requests[j]
                    budget += batch.num_tokens.pop(j)
                self._preempt(victim)
                preempted.add(victim)
                if victim is req:
                    break
            else:
                finishing = finishing or self._finishes(req, n)
                self.kv.allocate(req, n)
                batch.requests.append(req)
                batch.num_tokens.append(n)
                budget -= n
                continue
            break
        w = 0  # requests whose prefix is coming from L3 or being prefilled wait in place; the ones behind go on
        while (w < len(self.waiting) and budget > 0 and not preempted and not closed
               and len(self.running) < self.cfg.max_num_seqs):
            req = self.waiting[w]
            if not self.kv.ready(req) or (
                self.dedup_prefill and follows_inflight_prefill(req, self.running, self.kv.page_size)
            ):
                w += 1
                continue
            hit = self.kv.admit(req)  # waiting requests hold no pages
            n = self._chunk(req, budget)
            if self._holds_back(req, n, finishing) or not self.kv.can_allocate(req, n):
                self.kv.release(req)  # give the lock back; try again next step
                break
            del self.waiting[w]
            if not req.admitted_once:
                req.admitted_once = True
                req.stats.cached_tokens = hit.tokens
                req.stats.tier_tokens.update(hit.by_tier())
            if req.stats.scheduled is None:
                req.stats.scheduled = time.monotonic()
            req.status = RequestStatus.RUNNING
            finishing = finishing or self._finishes(req, n)
            self.kv.allocate(req, n)
            self.running.append(req)
            batch.requests.append(req)
            batch.num_tokens.append(n)
            budget -= n
        return batch

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
        self.kv.release(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.stats.finished = time.monotonic()

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.running)
