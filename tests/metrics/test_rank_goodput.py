"""Goodput and slack in a rank's metrics (metrics/rank.py): a finished request counts as met when its TTFT
and its mean time per output token are within `--ttft-target-ms` / `--tpot-target-ms`, and its slack
(target minus what it got) goes to two histograms; failed and aborted requests count in neither."""
from __future__ import annotations

from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import RequestStats
from kvstrata.metrics import PREFIX
from kvstrata.metrics.rank import LatencyTargets, Metrics


def finished(rid: str, ttft: float | None, decode_s: float, tokens: int, reason: str = "stop") -> RequestOutput:
    stats = RequestStats(arrival=100.0, output_tokens=tokens)
    if ttft is not None:
        stats.first_token = 100.0 + ttft
        stats.finished = stats.first_token + decode_s
    return RequestOutput(rid, [], "", finished=True, finish_reason=reason, output_tokens=tokens, stats=stats)


def sample(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(PREFIX + name, labels) or 0.0


def test_met_and_missed_by_either_target() -> None:
    m = Metrics(targets=LatencyTargets(ttft_s=1.0, tpot_s=0.1))
    m.observe(finished("fast", ttft=0.5, decode_s=0.9, tokens=11))  # 0.09 s a token after the first
    m.observe(finished("late-first", ttft=1.5, decode_s=0.5, tokens=11))
    m.observe(finished("slow-decode", ttft=0.2, decode_s=3.0, tokens=11))  # 0.3 s a token
    m.observe(finished("one-token", ttft=0.3, decode_s=0.0, tokens=1))  # no time per output token: TTFT decides
    m.observe(finished("failed", ttft=None, decode_s=0.0, tokens=0, reason="error"))
    m.observe(finished("aborted", ttft=0.1, decode_s=0.1, tokens=2, reason="abort"))
    assert sample(m, "request_goodput_total", slo="met") == 2
    assert sample(m, "request_goodput_total", slo="missed") == 2
    assert sample(m, "request_ttft_slack_seconds_count") == 4
    assert sample(m, "request_tpot_slack_seconds_count") == 3
    assert sample(m, "request_ttft_slack_seconds_bucket", le="-0.5") == 1  # late-first: 0.5 s over
    # TPOT slack 0.01 (fast), 0.05 (late-first), -0.2 (slow-decode); no _sum: the buckets go below 0
    assert [sample(m, "request_tpot_slack_seconds_bucket", le=le) for le in ("-0.5", "-0.1", "0.0", "0.05")] \
        == [0, 1, 1, 3]


def test_targets_come_from_the_flags_in_seconds() -> None:
    t = LatencyTargets(ttft_s=2.0, tpot_s=0.2)
    stats = RequestStats(arrival=0.0, first_token=2.5, finished=3.5, output_tokens=6)
    ttft, tpot = t.slack(stats)
    assert ttft is not None and tpot is not None
    assert abs(ttft + 0.5) < 1e-9 and abs(tpot) < 1e-9  # 1 s over 5 tokens is the 0.2 s target exactly
