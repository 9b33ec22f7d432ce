"""The slo policy's step sizing (no clock read: the step timer's coefficients are set, the clock stopped)."""
from __future__ import annotations

from kvstrata.config import SchedulerConfig
from kvstrata.engine.request import Request, RequestStatus
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.engine.scheduler import ScheduledBatch
from kvstrata.engine.slo_policy import STEP_SHARE, SloPolicy
from kvstrata.engine.step_timer import StepTimer

NOW = 100.0


def policy(coef: tuple[float, ...] = (0.01, 0.005, 0.001, 0.0, 0.0)) -> SloPolicy:
    timer = StepTimer()
    timer.set_coefficients(coef)
    p = SloPolicy(SchedulerConfig(ttft_target_ms=2000, tpot_target_ms=200), None, timer)  # type: ignore[arg-type]
    p.clock = lambda: NOW
    return p


def decoding(name: str, ttft_s: float) -> Request:
    req = Request(name, [1] * 20, SamplingParams())
    req.stats.arrival, req.stats.first_token = NOW - 5, NOW - 5 + ttft_s
    req.token_ids.append(2)
    req.num_computed_tokens = 20
    req.status = RequestStatus.RUNNING
    return req


def rows(*reqs: Request) -> ScheduledBatch:
    return ScheduledBatch(list(reqs), [1] * len(reqs))


def test_decode_rows_on_target_size_the_step() -> None:
    p = policy()
    assert abs(p.prefill_seconds(rows(decoding("a", 0.5), decoding("b", 0.4))) - (STEP_SHARE * 0.2 - 0.02)) < 1e-9


def test_rows_that_missed_their_first_token_do_not() -> None:
    assert policy().prefill_seconds(rows(decoding("late", 3.0))) is None


def test_prompts_get_at_least_what_the_decode_rows_take() -> None:
    slow = policy((0.1, 0.02, 0.001, 0.0, 0.0))  # 8 rows: 0.26 s, past the target alone
    reqs = [decoding(f"r{i}", 0.5) for i in range(8)]
    assert abs(slow.prefill_seconds(rows(*reqs)) - 0.26) < 1e-9


def test_a_prompt_that_makes_its_target_only_with_whole_steps_gets_them() -> None:
    """1,000 tokens: 1 s of prefill in whole steps, ~1.15 s in slices of 0.13 s of prefill 150 ms apart."""
    p = policy()
    req = Request("p", [1] * 1000, SamplingParams())
    req.stats.arrival = NOW - 1.4  # due at NOW + 0.6: 0.6 s left for 1 s of work: late either way
    assert not p.needs_whole_steps(req, 0.13)
    req.stats.arrival = NOW - 0.9  # 1.1 s left: whole steps make it (1 s), 0.13 s slices do not (~1.15 s)
    assert p.needs_whole_steps(req, 0.13)
    req.stats.arrival = NOW  # 2 s left: slices make it too
    assert not p.needs_whole_steps(req, 0.13)
