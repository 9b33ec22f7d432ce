"""bench/args.py: the bounds check of a workload's flags."""
from __future__ import annotations

import pytest

from kvstrata.bench.args import check_ranges


def test_check_ranges_accepts_the_bounds_themselves() -> None:
    check_ranges([("--turns", 2, 2, 30), ("--turns", 30, 2, 30)])


def test_check_ranges_names_the_first_flag_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"^--sessions must be in \[1, 64\] \(got 0\)$"):
        check_ranges([("--agents", 1, 1, 64), ("--sessions", 0, 1, 64), ("--turns", 99, 2, 30)])
