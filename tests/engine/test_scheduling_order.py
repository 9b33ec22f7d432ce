"""The scheduler's order on a tiny random-weight model: which prompt a step prefills first (FCFS with
finish-first, priority, the slo policy's steps sized by time) and which request preemption takes."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from kvstrata.engine.llm import LLM
from kvstrata.engine.request import RequestStatus
from kvstrata.engine.sampling_params import SamplingParams
from scheduler_support import GREEDY, make, prompts


def _prefill_done_steps(llm: LLM, ps: list[list[int]], **add: Any) -> tuple[dict[str, int], list[list[str]]]:
    """Add `ps` together, step until done: the step each request's prefill completed in (its first
    token), and which requests each step ran."""
    eng = llm.engine
    ids = [f"r{i}" for i in range(len(ps))]
    for rid, p in zip(ids, ps):
        eng.add_request(rid, p, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    done: dict[str, int] = {}
    steps: list[list[str]] = []
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        steps.append([r.request_id for r in batch.requests])
        for out in eng.postprocess(batch, eng.runner.run(batch)):
            done.setdefault(out.request_id, len(steps))
    eng.check_integrity()
    return done, steps


def test_fcfs_prefill_finishes_the_oldest_prompt_first(tiny_model_dir: Path) -> None:
    """4 cold prompts arrive together: the step budget goes to the oldest first, so they finish
    prefill one after another (r0 in step 1), not all together in the last step; decode rows of
    those already prefilled stay in every later step."""
    llm = make(tiny_model_dir, max_num_batched_tokens=64, enable_prefix_caching=False)
    ps = prompts(4, lo=60, hi=60, seed=3)  # 60 tokens each: one fits a step's budget of 64
    done, steps = _prefill_done_steps(llm, ps)
    assert done == {"r0": 1, "r1": 2, "r2": 3, "r3": 4}
    assert steps[0] == ["r0"]  # r0 whole (60); finish-first: r1 starts no 4-token chunk beside it
    for k in range(1, 4):  # each prefilled request decodes in every step after its prefill
        assert [f"r{i}" for i in range(k)] == steps[k][:k]
    # the old per-request cap (chunks of 16 for everyone) finishes them all in the same step
    capped = make(tiny_model_dir, max_num_batched_tokens=64, chunked_prefill_size=16, enable_prefix_caching=False)
    done_capped, _ = _prefill_done_steps(capped, ps)
    assert len(set(done_capped.values())) == 1 and min(done_capped.values()) > done["r0"]


def test_finish_first_keeps_partial_chunks_out_of_a_finishing_step(tiny_model_dir: Path) -> None:
    """Two 80-token prompts, budget 64: r0's last 16 tokens run alone (r1's 48-token chunk would hold
    r0's first token back); a prompt that finishes in the step still joins it; off = the step is filled."""
    ps = prompts(3, lo=80, hi=80, seed=5)
    llm = make(tiny_model_dir, max_num_batched_tokens=64, enable_prefix_caching=False)
    done, steps = _prefill_done_steps(llm, ps[:2])
    assert steps[:2] == [["r0"], ["r0"]] and done["r0"] == 2
    assert steps[2] == ["r0", "r1"] and done["r1"] == 4  # r0 decodes; r1 gets 63, then its last 17
    # a short prompt behind r0 finishes in r0's finishing step too: it joins
    llm2 = make(tiny_model_dir, max_num_batched_tokens=64, enable_prefix_caching=False)
    done2, steps2 = _prefill_done_steps(llm2, [ps[0], ps[1][:20], ps[2]])
    assert steps2[1] == ["r0", "r1"] and done2["r0"] == done2["r1"] == 2  # r2's partial chunk held back
    off = make(tiny_model_dir, max_num_batched_tokens=64, enable_prefix_caching=False, prefill_finish_first=False)
    done_off, steps_off = _prefill_done_steps(off, ps[:2])
    assert steps_off[1] == ["r0", "r1"] and done_off["r0"] == 2  # filled: r1's chunk beside r0's last 16


def test_priority_orders_admission_and_prefill(tiny_model_dir: Path) -> None:
    """A burst: a large low-priority prompt first, then small ones of a higher priority (lower value): the
    higher are admitted and prefilled first; within a priority, arrival order (FCFS)."""
    llm = make(tiny_model_dir, max_num_batched_tokens=64, chunked_prefill_size=64)
    eng = llm.engine
    big = prompts(1, 200, 200, seed=5)[0]
    small = prompts(3, 20, 20, seed=6)
    eng.add_request("batch-job", big, replace(GREEDY, priority=5))
    eng.add_request("turn-a", small[0], replace(GREEDY, priority=-1))
    eng.add_request("plain", small[1], GREEDY)
    eng.add_request("turn-b", small[2], replace(GREEDY, priority=-1))
    assert [r.request_id for r in eng.scheduler.waiting] == ["turn-a", "turn-b", "plain", "batch-job"]
    batch = eng.scheduler.schedule()
    assert [r.request_id for r in batch.requests] == ["turn-a", "turn-b", "plain"]  # 60 of the step's 64 tokens
    assert batch.num_tokens == [20, 20, 20]
    eng.postprocess(batch, eng.runner.run(batch))
    batch = eng.scheduler.schedule()  # decode rows first, then the big prompt's chunk in what is left
    assert [r.request_id for r in batch.requests] == ["turn-a", "turn-b", "plain", "batch-job"]
    assert batch.num_tokens == [1, 1, 1, 61]
    eng.postprocess(batch, eng.runner.run(batch))
    while eng.has_unfinished():
        eng.step()
    eng.check_integrity()


def test_pages_running_short_preempt_the_lowest_priority(tiny_model_dir: Path) -> None:
    """Preemption takes the lowest priority, even when it was admitted first; at equal priority the most
    recently admitted (as before priorities)."""
    llm = make(tiny_model_dir, max_total_tokens=160, page_size=16)
    eng = llm.engine
    low, high = prompts(2, 40, 40, seed=8)
    params = replace(GREEDY, max_tokens=60)
    eng.add_request("low", low, replace(params, priority=3))
    eng.step()
    eng.add_request("high", high, params)
    preempted: list[str] = []
    while eng.has_unfinished():
        running = list(eng.scheduler.running)
        eng.step()
        preempted += [r.request_id for r in running if r.status is RequestStatus.WAITING]
    assert preempted and set(preempted) == {"low"}
    eng.check_integrity()


def _burst(tiny_model_dir: Path, policy: str) -> Any:
    """Two requests decoding, then a burst: a 1,900-token prompt (the oldest) and three of 100 tokens. The step
    timer is set (10 ms a step, 5 ms a row, 1 ms a prompt token) and the clock stopped at 100 s: no timing."""
    llm = make(tiny_model_dir, max_num_batched_tokens=512, enable_prefix_caching=False, scheduling_policy=policy,
               ttft_target_ms=2000, tpot_target_ms=200)
    eng = llm.engine
    for i, p in enumerate(prompts(2, 10, 10, seed=11)):
        eng.add_request(f"d{i}", p, replace(GREEDY, max_tokens=40))
    batch = eng.scheduler.schedule()
    eng.postprocess(batch, eng.runner.run(batch))
    eng.scheduler.timer.set_coefficients((0.01, 0.005, 0.001, 0.0, 0.0))
    if eng.scheduler.slo is not None:
        eng.scheduler.slo.clock = lambda: 100.0
    big, *small = prompts(4, 100, 100, seed=12)
    for name, p, arrival in [("big", big * 19, 99.0), ("s1", small[0], 99.1), ("s2", small[1], 99.2),
                             ("s3", small[2], 99.3)]:
        eng.add_request(name, p, replace(GREEDY, max_tokens=4))
        eng._requests[name].stats.arrival = arrival
    return eng


def _steps(eng: Any, n: int) -> list[list[tuple[str, int]]]:
    out = []
    for _ in range(n):
        batch = eng.scheduler.schedule()
        out.append([(r.request_id, k) for r, k in zip(batch.requests, batch.num_tokens)])
        eng.postprocess(batch, eng.runner.run(batch))
    return out


def test_slo_serves_the_prompts_that_can_make_their_target_in_steps_sized_by_time(tiny_model_dir: Path) -> None:
    """Under slo the 1.9 s prompt cannot make its 2 s target, so the three short ones go first, one a step: while
    requests decode each step takes the prefill that fits in 3/4 of the 200 ms TPOT target less the decode rows'
    share (130, 125, 120 ms), and a partial chunk behind a finishing prompt is held back. Then the big one in
    chunks of what is left. Under fcfs it takes the whole token budget first."""
    eng = _burst(tiny_model_dir, "slo")
    steps = _steps(eng, 4)
    assert steps[0] == [("d0", 1), ("d1", 1), ("s1", 100)]  # 130 ms: s2's 30-token chunk held back
    assert steps[1] == [("d0", 1), ("d1", 1), ("s1", 1), ("s2", 100)]
    assert steps[2] == [("d0", 1), ("d1", 1), ("s1", 1), ("s2", 1), ("s3", 100)]
    # 10 + 5 rows x 5 ms = 35 ms of decode: 115 prompt tokens (114 where 0.15 - 0.035 rounds below 0.115)
    assert steps[3][:5] == [("d0", 1), ("d1", 1), ("s1", 1), ("s2", 1), ("s3", 1)]
    assert steps[3][5][0] == "big" and steps[3][5][1] in (114, 115)
    while eng.has_unfinished():
        eng.step()
    eng.check_integrity()

    fcfs = _burst(tiny_model_dir, "fcfs")
    assert _steps(fcfs, 1)[0] == [("d0", 1), ("d1", 1), ("big", 510)]
