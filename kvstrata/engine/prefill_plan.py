"""The order prompts are prefilled in under `--scheduling-policy slo`: as many first tokens within the TTFT
target as the work allows, none dropped, none starved.

Every prompt's deadline is its arrival plus the TTFT target, and its work is the predicted time of its uncached
tokens (step_timer.py). With one target for all, earliest-deadline-first alone is first-come-first-served, and a
20k-token prompt that cannot make its target holds back every short prompt behind it that still could. So,
within each priority (lower value first, always):
1. **Resuming**: a request preempted after its first token is decoding; its recompute goes first.
2. **Aged**: a prompt waiting longer than AGING_TARGETS targets goes next, oldest first, whatever it costs:
   nothing starves however many feasible prompts keep arriving.
3. **On time**, chosen by Moore and Hodgson's rule (the most deadlines met on one machine): walk the prompts
   by deadline adding up their work; whenever the running total passes the current prompt's deadline, the
   largest prompt taken so far cannot be afforded and moves to the late list. The ones kept then go shortest
   first wherever that keeps every deadline (a short turn passes a long prompt that can afford to wait).
4. **Late**: the prompts that yielded, oldest first. They are still served, after the ones that can still
   make it (and become aged in turn).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import groupby

from kvstrata.engine.request import Request

AGING_TARGETS = 4.0  # a prompt waiting this many TTFT targets goes ahead of every newer one of its priority
# the leading on-time prompts reordered shortest first (quadratic in them, and the plan is made every step)
SHORTEST_FIRST_MAX = 64


@dataclass(frozen=True)
class Prompt:
    req: Request
    work_s: float  # predicted seconds of prefill left (its uncached tokens)

    @property
    def arrival(self) -> float:
        return self.req.stats.arrival


def slo_order(prompts: list[Prompt], now: float, ttft_target_s: float) -> list[Request]:
    """The prompts in the order to prefill them (module docstring)."""
    out: list[Request] = []
    t = now
    ordered = sorted(prompts, key=lambda p: p.req.params.priority)
    for _, grp in groupby(ordered, key=lambda p: p.req.params.priority):
        group = sorted(grp, key=lambda p: p.arrival)
        resuming = [p for p in group if p.req.num_output_tokens > 0]
        aged = [p for p in group if p.req.num_output_tokens == 0 and now - p.arrival > AGING_TARGETS * ttft_target_s]
        first = resuming + aged
        picked = {id(p) for p in first}
        t += sum(p.work_s for p in first)
        on_time, late = _moore_hodgson([p for p in group if id(p) not in picked], t, ttft_target_s)
        on_time = _shortest_first(on_time, t, ttft_target_s)
        t += sum(p.work_s for p in on_time) + sum(p.work_s for p in late)
        out.extend(p.req for p in first + on_time + sorted(late, key=lambda p: p.arrival))
    return out


def _moore_hodgson(prompts: list[Prompt], start: float, target_s: float) -> tuple[list[Prompt], list[Prompt]]:
    """(the prompts kept, by deadline; the ones that yield), starting at `start`."""
    heap: list[tuple[float, float, int]] = []  # (-work, -arrival, index): the largest taken so far on top
    ordered = sorted(prompts, key=lambda p: p.arrival)  # deadline = arrival + the one target
    dropped: set[int] = set()
    t = start
    for i, p in enumerate(ordered):
        heapq.heappush(heap, (-p.work_s, -p.arrival, i))
        t += p.work_s
        if t > p.arrival + target_s:
            _, _, big = heapq.heappop(heap)
            t -= ordered[big].work_s
            dropped.add(big)
    kept = [p for i, p in enumerate(ordered) if i not in dropped]
    return kept, [ordered[i] for i in sorted(dropped)]


def _shortest_first(prompts: list[Prompt], start: float, target_s: float) -> list[Prompt]:
    """The on-time prompts (all meet their deadlines in deadline order from `start`), reordered so that at
    each place the shortest prompt that keeps every deadline goes first: a short turn need not wait behind a
    long prompt that can afford to let it pass. Moving prompt j to the front delays only the prompts before it
    in deadline order, each by j's work: allowed where j's work is at most the least slack among them."""
    rest = list(prompts[:SHORTEST_FIRST_MAX])  # deadline order; the ones past it keep that order after them
    out: list[Prompt] = []
    t = start
    while rest:
        slack = []  # least slack of rest[:i], given deadline order from t
        done, least = t, float("inf")
        for p in rest:
            slack.append(least)
            done += p.work_s
            least = min(least, p.arrival + target_s - done)
        pick = min((i for i in range(len(rest)) if rest[i].work_s <= slack[i]),
                   key=lambda i: (rest[i].work_s, i))
        t += rest[pick].work_s
        out.append(rest.pop(pick))
    return out + prompts[SHORTEST_FIRST_MAX:]
