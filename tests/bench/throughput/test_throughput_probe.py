"""The HTTP throughput probe: the decode window, and a run against the test-double peer."""
from __future__ import annotations

import pytest

from _fake_openai_peer import CACHED_TOKENS, CHUNKS, FakePeer
from kvstrata.bench.client import ChatResult
from kvstrata.bench.throughput.probe import ProbeConfig, decode_rate, probe_throughput


def stream(times: list[float], completion_tokens: int | None = None, error: str | None = None) -> ChatResult:
    return ChatResult("x" * len(times), 0.0, times[-1] if times else 1.0, times[0] if times else None, "length",
                      10, completion_tokens, None, len(times), error, tuple(times))


def test_decode_window_is_where_every_stream_decodes() -> None:
    # stream a: tokens at 1..10, stream b: 2..11 -> window (2, 10]: a has 3..10 (8), b has 3..10 (8)
    a = stream([float(t) for t in range(1, 11)])
    b = stream([float(t) for t in range(2, 12)])
    rate = decode_rate([a, b])
    assert rate["overlapped"] and rate["window_s"] == 8.0 and rate["tokens_per_s"] == pytest.approx(16 / 8)
    assert rate["completion_tokens"] == 20


def test_batch_one_counts_tokens_after_the_first_and_scales_chunks_to_tokens() -> None:
    one = decode_rate([stream([0.5, 1.0, 1.5, 2.5], completion_tokens=8)])  # 2 tokens per chunk
    assert one["tokens_per_s"] == pytest.approx(3 * 2 / 2.0)


def test_streams_served_one_after_another_use_the_whole_run() -> None:
    rate = decode_rate([stream([0.0, 1.0, 2.0]), stream([3.0, 4.0, 5.0])])
    assert not rate["overlapped"] and rate["window_s"] == 5.0 and rate["tokens_per_s"] == pytest.approx(4 / 5)


def test_failed_or_short_streams_give_no_figure() -> None:
    assert decode_rate([stream([1.0]), stream([], error="HTTP 500")])["tokens_per_s"] is None


def test_probe_against_a_peer(fake_peer: FakePeer) -> None:
    fake_peer.reset()
    fake_peer.gather = 3  # the batch-3 streams' tokens wait until all three are open: they overlap surely
    result = probe_throughput(fake_peer.url, "ok", ProbeConfig(prefill_tokens=300, decode_tokens=16, decode_batch=3,
                                                                repeats=2))
    bodies = fake_peer.requests
    assert len(bodies) == 1 + 2 + 1 + 3  # warm-up, prefill x2, decode at batch 1 and batch 3
    assert all(b["ignore_eos"] is True and b["stream"] for b in bodies)
    assert [b["max_tokens"] for b in bodies] == [1, 1, 1, 16, 16, 16, 16]
    firsts = [b["messages"][0]["content"].split(".")[0] for b in bodies]
    assert len(set(firsts)) == len(bodies)  # a unique nonce leads every prompt: nothing can be cached
    assert len(bodies[1]["messages"][0]["content"].split()) >= 250  # the ~300-token prefill prompt
    assert result["errors"] == 0 and len(result["prefill"]) == 2
    for p in result["prefill"]:
        assert p["tokens_per_s"] == pytest.approx((100 - CACHED_TOKENS) / p["prefill_s"])  # the peer's usage
    assert set(result["decode_tokens_per_s"]) == {"1", "3"}
    assert fake_peer.max_in_flight == 3  # the probe opened the batch-3 streams at once
    assert result["decode"]["3"]["overlapped"] and result["decode"]["3"]["completion_tokens"] == 3 * CHUNKS
    assert all(v is not None and v > 0 for v in result["decode_tokens_per_s"].values())


def test_probe_counts_failures(fake_peer: FakePeer) -> None:
    result = probe_throughput(fake_peer.url, "fail", ProbeConfig(prefill_tokens=100, decode_tokens=8, decode_batch=2,
                                                                  repeats=1))
    assert result["errors"] == 1 + 1 + 1 + 2 and result["first_error"].startswith("HTTP 500")
    assert result["prefill_tokens_per_s"] is None and result["decode_tokens_per_s"] == {"1": None, "2": None}


@pytest.mark.parametrize(("field", "value", "flag"), [("prefill_tokens", 10, "--prefill-tokens"),
                                                      ("decode_batch", 0, "--decode-batch"),
                                                      ("repeats", 0, "--probe-repeats")])
def test_bad_probe_settings_name_the_flag(field: str, value: int, flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        ProbeConfig(**{field: value}).validate()


def test_a_long_prefill_needs_a_context_that_holds_it() -> None:
    with pytest.raises(ValueError, match=r"--prefill-tokens must be in \[64, 3800\]"):
        ProbeConfig(prefill_tokens=16000).validate()
    ProbeConfig(prefill_tokens=16000, decode_tokens=16, context=16384).validate()
    with pytest.raises(ValueError, match=r"\[64, 16304\]"):
        ProbeConfig(prefill_tokens=16384, decode_tokens=16, context=16384).validate()
