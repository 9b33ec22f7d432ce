"""The fleet workload's sessions and its figures: rank shares, hit efficiency against the achievable,
TTFT of first and later turns."""
from __future__ import annotations

import pytest

from kvstrata.bench.client import ChatResult, RequestRecord
from kvstrata.bench.fleet.workload import FleetConfig, FleetWorkload, fleet_figures


def test_sessions_share_the_system_prompt_and_resend_their_history() -> None:
    w = FleetWorkload(FleetConfig(sessions=2, prefix_tokens=200, turns=3, turn_tokens=16))
    first, other = w.messages(0, []), w.messages(1, [])
    assert first[0] == other[0] and first[0]["role"] == "system" and first[1] != other[1]
    third = w.messages(0, ["r0", "r1"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[:2] == first and third[2]["content"] == "r0"
    assert FleetWorkload(FleetConfig(seed=3, sessions=1, turns=1)).system == FleetWorkload(FleetConfig(seed=3, sessions=1, turns=1)).system


@pytest.mark.parametrize(("field", "value", "flag"), [("sessions", 0, "--sessions"), ("prefix_tokens", 10, "--prefix-tokens"),
                                                      ("join_gap_s", -1.0, "--join-gap")])
def test_bad_settings_name_the_flag(field: str, value: float, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        FleetConfig(**{field: value}).validate()


def rec(session: int, turn: int, rank: int | None, cached: int, ttft: float | None, ok: bool = True) -> RequestRecord:
    result = ChatResult("x", 0.0, 1.0, ttft, "stop", 100, 1, cached, 1, None if ok else "HTTP 500", rank=rank)
    return RequestRecord(session, 0, turn, "user", [], result)


def test_figures() -> None:
    records = [rec(0, 0, 0, 0, 4.0), rec(1, 0, 1, 48, 2.0), rec(0, 1, 0, 64, 0.5), rec(1, 1, 1, 0, None, ok=False)]
    f = fleet_figures(records, [0, 64, 64, 80], 2, 8.0)
    assert f["rank_share"] == [round(2 / 3, 3), round(1 / 3, 3)] and f["smallest_rank_share"] == round(1 / 3, 3)
    assert (f["cached_tokens"], f["achievable_tokens"], f["hit_efficiency"]) == (112, 128, 0.875)  # the failed one out
    assert f["errors"] == 1 and f["first_ttft_p50_s"] == 3.0 and f["later_ttft_p50_s"] == 0.5
    assert f["duration_s"] == 8.0


def test_no_request_answered_gives_no_figures() -> None:
    f = fleet_figures([rec(0, 0, None, 0, None, ok=False)], [0], 2, 1.0)
    assert f["rank_share"] == [0.0, 0.0] and f["hit_efficiency"] is None and f["later_ttft_p50_s"] is None
