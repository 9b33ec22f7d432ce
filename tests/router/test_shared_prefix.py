"""SharedPrefixes: a prompt's shared prefix ends at its last page that two conversations have continued
differently; a session's own growing turns never make one."""
from __future__ import annotations

import pytest

from kvstrata.router.shared_prefix import SharedPrefixes


def test_a_branch_point_marks_the_shared_prefix() -> None:
    seen = SharedPrefixes()
    system = [1, 2, 3]
    a1, a2 = [*system, 10], [*system, 10, 11, 12]  # session a's turns: each extends the one before
    b1 = [*system, 20]
    seen.observe(a1)
    seen.observe(a2)
    assert seen.shared_pages(a2) == 0 and seen.shared_pages(b1) == 0  # one conversation: nothing shared
    seen.observe(b1)
    assert seen.shared_pages([*system, 30, 31]) == 3  # page 3 was continued by 10 and by 20
    assert seen.shared_pages(a2) == 3 and seen.shared_pages([9, 2, 3]) == 0
    seen.observe([*system, 10, 11, 40])  # a branches at its own page 11: a's history up to it is shared too
    assert seen.shared_pages([*system, 10, 11, 50]) == 5


def test_a_prompt_that_ends_where_another_goes_on_is_no_branch() -> None:
    seen = SharedPrefixes()
    seen.observe([1, 2])
    seen.observe([1, 2, 3])
    seen.observe([1, 2, 3])
    assert seen.shared_pages([1, 2, 3, 4]) == 0


def test_bounded() -> None:
    seen = SharedPrefixes(capacity=4)
    for start in range(0, 40, 4):
        seen.observe([start, start + 1, start + 2])
    assert len(seen) <= 4
    with pytest.raises(ValueError):
        SharedPrefixes(capacity=0)
