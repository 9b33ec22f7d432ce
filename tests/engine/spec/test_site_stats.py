"""Agreement per site (kvstrata/engine/spec/site_stats.py): where drafts break, learned per request."""
from __future__ import annotations

import pytest

from kvstrata.engine.spec import site_stats
from kvstrata.engine.spec.site_stats import SiteStats


def test_a_new_site_gets_the_requests_overall_agreement() -> None:
    s = SiteStats()
    assert s.chances([1, 2, 3], [4, 5]) == pytest.approx([0.75, 0.75 ** 2])
    s.learn([10, 11, 12], [13, 14, 15], [13, 14, 15])  # 3 of 3 agreed
    r = (3 + 3) / (3 + 4)
    assert s.overall == pytest.approx(r)
    assert s.chances([20, 21, 22], [23]) == pytest.approx([r])


def test_a_site_where_the_model_writes_something_new_scores_low() -> None:
    s = SiteStats()
    for n in range(6):  # after [7, 8, 9] the proposal said 1, the model wrote a new number
        s.learn([5, 7, 8, 9], [1, 2], [100 + n, 2])
    r = s.overall
    assert r == pytest.approx(3 / 10)  # each learn stops at its first difference: 0 of 6 agreed
    low = s.chances([0, 7, 8, 9], [1])[0]
    assert low == pytest.approx((0 + site_stats.PRIOR * r) / (6 + site_stats.PRIOR))
    # the site is the tokens before the drafted position, from the context and then from the draft itself
    assert s.chances([7, 8], [9, 1])[1] == pytest.approx(s.chances([7, 8], [9])[0] * low)


def test_learning_stops_at_the_first_difference() -> None:
    s = SiteStats()
    s.learn([1, 2, 3], [4, 5, 6, 7], [4, 9, 6, 7])
    assert (s.agreed, s.seen) == (1, 2) and len(s) == 2
    s.learn([1, 2, 3], [], [4])  # nothing proposed: nothing learned
    assert s.seen == 2


def test_sites_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_stats, "MAX_SITES", 8)
    s = SiteStats()
    s.learn([0, 0, 0], [1, 1], [1, 2])  # site (0, 0, 0) twice ...
    s.learn([0, 0, 0], [1], [1])
    for k in range(20):
        s.learn([k, k, k + 1], [5], [5])
    assert len(s) <= 8


def test_a_site_at_the_start_of_a_short_context() -> None:
    s = SiteStats()
    s.learn([7, 8], [9], [5])  # the site is (7, 8): two tokens, all the context has
    assert s.chances([7, 8], [9])[0] < s.overall  # (7, 8) scores what it learned ...
    assert s.chances([1, 7, 8], [9])[0] == pytest.approx(s.overall)  # ... and (1, 7, 8) is another site
