"""The slo policy's prefill order: deadlines met, late prompts yield, aged ones first, priorities strict."""
from __future__ import annotations

from kvstrata.engine.prefill_plan import AGING_TARGETS, SHORTEST_FIRST_MAX, Prompt, slo_order
from kvstrata.engine.request import Request
from kvstrata.engine.sampling_params import SamplingParams

TARGET = 2.0
NOW = 100.0


def prompt(name: str, arrival: float, work_s: float, priority: int = 0, output: int = 0) -> Prompt:
    req = Request(name, [1] * 8, SamplingParams(priority=priority))
    req.stats.arrival = arrival
    req.token_ids += [2] * output
    return Prompt(req, work_s)


def order(*prompts: Prompt) -> list[str]:
    return [r.request_id for r in slo_order(list(prompts), NOW, TARGET)]


def test_prompts_that_all_make_it_go_shortest_first() -> None:
    assert order(prompt("b", 99.5, 0.2), prompt("a", 99.0, 0.3), prompt("c", 99.8, 0.1)) == ["c", "b", "a"]


def test_a_short_prompt_passes_a_long_one_only_where_the_long_one_still_makes_it() -> None:
    """a (due 100.5) done at 100.45 alone; behind b it would end at 100.55: a goes first. With 0.1 s more slack,
    b passes it."""
    assert order(prompt("a", 98.5, 0.45), prompt("b", 99.9, 0.1)) == ["a", "b"]
    assert order(prompt("a", 98.6, 0.45), prompt("b", 99.9, 0.1)) == ["b", "a"]


def test_a_prompt_that_cannot_make_its_target_yields_to_those_that_can() -> None:
    """A 2.5 s prompt first, three short ones behind it: served first, it makes none of the four; yielding, the
    three meet their deadlines and it is still served, last."""
    got = order(prompt("big", 99.0, 2.5), prompt("s1", 99.1, 0.2), prompt("s2", 99.2, 0.2), prompt("s3", 99.3, 0.2))
    assert got == ["s1", "s2", "s3", "big"]


def test_the_largest_yields_even_when_it_came_first() -> None:
    """Moore-Hodgson: when the running total passes a deadline, the largest prompt taken so far moves to the late
    list. a alone would make it (100.9 <= 101.0) but then b, c and d miss; yielding, b, c and d make theirs."""
    got = order(prompt("a", 99.0, 0.9), prompt("b", 99.1, 0.3), prompt("c", 99.2, 0.3), prompt("d", 99.3, 0.3))
    assert got == ["b", "c", "d", "a"]


def test_late_prompts_are_served_oldest_first() -> None:
    got = order(prompt("late2", 98.0, 0.1), prompt("late1", 97.5, 3.0), prompt("ok", 99.9, 0.1))
    assert got == ["ok", "late1", "late2"]  # both are past their deadline: arrival order, whatever their size


def test_aged_prompts_go_first_however_large() -> None:
    old = NOW - AGING_TARGETS * TARGET - 0.1
    got = order(prompt("fresh", 99.9, 0.1), prompt("aged", old, 0.5), prompt("late", 97.0, 0.1))
    assert got == ["aged", "fresh", "late"]


def test_a_preempted_decoding_request_resumes_first() -> None:
    got = order(prompt("new", 99.9, 0.1), prompt("resume", 99.95, 0.4, output=3))
    assert got == ["resume", "new"]


def test_priority_is_strict() -> None:
    """A higher priority (lower value) goes first even when late; the lower class is planned after its work."""
    got = order(prompt("bg", 99.9, 0.1, priority=1), prompt("urgent-late", 97.0, 0.5, priority=-1),
                prompt("urgent", 99.8, 0.2, priority=-1))
    assert got == ["urgent", "urgent-late", "bg"]


def test_no_prompt_is_dropped() -> None:
    ps = [prompt(f"p{i}", 95.0 + i * 0.3, 0.1 + (i % 5) * 0.7, priority=i % 2) for i in range(20)]
    got = order(*ps)
    assert sorted(got) == sorted(p.req.request_id for p in ps)


def test_a_long_queue_reorders_only_its_leading_prompts() -> None:
    """Shortest-first is quadratic in the prompts it reorders: past SHORTEST_FIRST_MAX they keep deadline order."""
    ps = [prompt(f"p{i:03d}", 99.0 + i * 1e-3, 0.001 * (1 + (7 * i) % 5)) for i in range(300)]
    got = order(*ps)
    assert sorted(got) == sorted(p.req.request_id for p in ps)
    assert got[SHORTEST_FIRST_MAX:] == [f"p{i:03d}" for i in range(SHORTEST_FIRST_MAX, 300)]
    assert got[:SHORTEST_FIRST_MAX] != [f"p{i:03d}" for i in range(SHORTEST_FIRST_MAX)]
