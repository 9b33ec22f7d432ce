"""The `slo` scheduling policy's decisions for one step (`--scheduling-policy slo`, docs/scheduling.md):
in which order prompts prefill (prefill_plan.py over each prompt's predicted work), and how much of a step
they get while requests decode (step_timer.py's prediction against the TPOT target).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from kvstrata.config import SchedulerConfig
from kvstrata.engine.kv_manager import KVCacheManager
from kvstrata.engine.prefill_plan import Prompt, slo_order
from kvstrata.engine.request import Request, RequestStatus
from kvstrata.engine.step_timer import StepShape, StepTimer

MIN_STEP_PREFILL = 32  # prompt tokens a step with decode rows still takes, however long they run
# a step with decode rows is sized to this share of the TPOT target: a request's TPOT is the mean of its steps,
# and steps sized to the whole target ran past it by the fit's error (docs/scheduling.md has the runs)
STEP_SHARE = 0.75
ESTIMATE_TTL_S = 0.5  # how long a waiting request's cached-prefix estimate is used before it is looked up again


class DecodeRows(Protocol):
    """A step's decode rows as the policy reads them (scheduler.ScheduledBatch)."""

    requests: list[Request]

    def shape(self) -> StepShape: ...

    def __len__(self) -> int: ...


class SloPolicy:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager, timer: StepTimer) -> None:
        self.kv = kv
        self.timer = timer
        self.ttft_s = cfg.ttft_target_ms / 1000.0
        self.step_s = STEP_SHARE * cfg.tpot_target_ms / 1000.0  # a step's time while requests decode
        self.clock: Callable[[], float] = time.monotonic
        self._estimates: dict[Request, tuple[float, int]] = {}  # waiting request -> (when, cached tokens)

    def forget(self, req: Request) -> None:
        """`req` was admitted or finished: its cached-prefix estimate goes."""
        self._estimates.pop(req, None)

    def plan(self, decode: DecodeRows, prefilling: list[Request],
             waiting: list[Request]) -> tuple[list[Request], float | None]:
        """(the prompts in the order to prefill them, the step's prefill time or None for tokens alone): `order`
        and `prefill_seconds` over the step's decode rows, whose time is predicted once; the first prompt gets
        whole steps where only they make its target (`needs_whole_steps`)."""
        decode_s = self.timer.predict(decode.shape()) if decode and self.timer.ready else 0.0
        order = self._order(prefilling + waiting, decode_s)
        seconds = self._prefill_seconds(decode, decode_s)
        if seconds is not None and order and self.needs_whole_steps(order[0], seconds):
            seconds = None
        return order, seconds

    def prefill_seconds(self, batch: DecodeRows) -> float | None:
        """`plan`'s step prefill time for the decode rows `batch` (see `_prefill_seconds`)."""
        return self._prefill_seconds(batch, self.timer.predict(batch.shape()) if self.timer.ready else 0.0)

    def _prefill_seconds(self, batch: DecodeRows, decode_s: float) -> float | None:
        """The time prefill may take in a step whose decode rows are `batch` (predicted to take `decode_s`): what
        keeps the step within `step_s`, but never less than the decode rows take (the step's first prompt chunk
        also gets at least MIN_STEP_PREFILL tokens); None (tokens alone size the step) without a decode row that
        can still meet its targets, or before the step timer has learnt this host. The floor: where the rows
        alone near the target (many of them, long contexts, a slow spell of the host), prompts cut to slivers
        would stop the queue while the rows would still miss it; with half of each step, prompts go on at half
        speed and a row waits at most two of its own steps."""
        if not self.timer.ready or not any(map(self._on_target, batch.requests)):
            return None
        return max(self.step_s - decode_s, decode_s)

    def _on_target(self, req: Request) -> bool:
        """Whether a decoding request can still meet both targets: its first token came within the TTFT target.
        Only such rows size a step by time: a row that missed its first token's target misses goodput whatever
        its TPOT, and under an overload where every row did, steps sized for them would only cut the prefill
        throughput the queue needs."""
        first = req.stats.first_token
        return first is not None and first - req.stats.arrival <= self.ttft_s

    def needs_whole_steps(self, req: Request, seconds: float) -> bool:
        """Whether the plan's first prompt meets its TTFT target with whole steps but not with steps of
        `seconds` of prefill: then this step is its (its first token is the one chance it has of goodput; the
        decode rows lose one step's worth of TPOT)."""
        if req.num_output_tokens > 0:
            return False
        now, deadline = self.clock(), req.stats.arrival + self.ttft_s
        done = self._done(req, now, refresh=False)  # plan's order has just looked it up
        work = self.timer.prefill_seconds(done, req.num_tokens - done)
        per_step = self.timer.prefill_seconds(done, max(1, self.timer.prefill_tokens_within(seconds, done)))
        steps = work / max(per_step, 1e-6)  # steps of `seconds` it would take, each a step's time apart
        return now + work <= deadline < now + steps * self.step_s

    def _order(self, prompts: list[Request], decode_s: float) -> list[Request]:
        """Running prompts and waiting requests together, in prefill_plan's order; while decode rows take
        `decode_s` of each step, prefill gets only what a step has left, so its work takes longer."""
        now = self.clock()
        stretch = 1.0 / max(0.5, 1.0 - decode_s / self.step_s)
        return slo_order([Prompt(r, stretch * self._work(r, now)) for r in prompts], now, self.ttft_s)

    def _work(self, req: Request, now: float) -> float:
        """Predicted seconds of prefill left for `req`."""
        done = self._done(req, now)
        return self.timer.prefill_seconds(done, req.num_tokens - done)

    def _done(self, req: Request, now: float, refresh: bool = True) -> int:
        """Tokens `req` need not prefill: a running request's computed ones, a waiting one's cached prefix,
        looked up again every ESTIMATE_TTL_S (the cache fills as other prompts run) where `refresh`."""
        if req.status is RequestStatus.RUNNING:
            return req.num_computed_tokens
        at, cached = self._estimates.get(req, (-1e9, 0))
        if refresh and now - at > ESTIMATE_TTL_S:
            cached = self.kv.cached_tokens(req)
            self._estimates[req] = (now, cached)
        return cached
