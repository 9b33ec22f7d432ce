"""`kvstrata bench repeat`: the seeded request stream and its summary."""
from __future__ import annotations

import pytest

from kvstrata.bench.response_cache.repeat import HOT_QUESTIONS, RIVER, RepeatResult, repeat_requests, summarize_repeat


def test_repeat_stream_is_seeded_and_mixes_hot_and_unique() -> None:
    reqs = repeat_requests(400, 0.5, 8, seed=3)
    assert reqs == repeat_requests(400, 0.5, 8, seed=3) and reqs != repeat_requests(400, 0.5, 8, seed=4)
    hot = [r.prompt for r in reqs if r.hot]
    unique = [r.prompt for r in reqs if not r.hot]
    assert len(hot) == 200 and set(hot) == set(HOT_QUESTIONS)
    assert 80 <= sum(r.hot for r in reqs[:200]) <= 120  # spread over the run, not bunched
    assert len(set(unique)) == len(unique) and not set(unique) & set(HOT_QUESTIONS)
    assert {r.prompt for r in repeat_requests(50, 1.0, 1, seed=0)} == {RIVER}
    assert not any(r.hot for r in repeat_requests(50, 0.0, 8, seed=0))
    with pytest.raises(ValueError, match="--repeat-ratio"):
        repeat_requests(10, 1.5, 8, seed=0)
    with pytest.raises(ValueError, match="--hot-prompts"):
        repeat_requests(10, 0.5, 9, seed=0)


def test_summary_splits_hot_unique_and_cache_hits() -> None:
    results = [RepeatResult(True, 0.002, "hit"), RepeatResult(True, 1.0, "miss"), RepeatResult(False, 3.0, "miss"),
               RepeatResult(False, 9.0, "", error="HTTP 500: boom")]
    s = summarize_repeat(results, {"workload": "repeat"})
    assert s["requests"] == 4 and s["errors"] == 1 and s["first_error"] == "HTTP 500: boom"
    assert s["cache_header"] == {"hit": 1, "miss": 2}
    assert s["all"]["requests"] == 3 and s["all"]["mean_ms"] == pytest.approx((2 + 1000 + 3000) / 3)
    assert s["hot"]["p50_ms"] == pytest.approx(501.0) and s["unique"]["mean_ms"] == pytest.approx(3000.0)
    assert s["cache_hit"]["p99_ms"] == pytest.approx(2.0) and s["cache_miss"]["requests"] == 2
