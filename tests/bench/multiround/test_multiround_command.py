"""`kvstrata bench multiround` end to end against the test-double peer, and its flag checks."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from _fake_openai_peer import CACHED_TOKENS, FakePeer, reply_for
from kvstrata.bench.cli import add_bench_parser, run_bench


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "multiround", *argv])


def test_bench_multiround_command(fake_peer: FakePeer, tokenizer_path: str, tmp_path: Path) -> None:
    fake_peer.reset()
    out = tmp_path / "multiround.json"
    args = parse(["--url", fake_peer.url, "--model", "ok", "--tokenizer", tokenizer_path, "--num-users", "3",
                  "--num-rounds", "3", "--system-tokens", "200", "--history-tokens", "300", "--answer-tokens", "12",
                  "--qps", "50", "--output", str(out)])
    assert (args.request_rate, args.max_tokens) == (50.0, 32)  # --qps is --request-rate; --max-tokens unused
    assert run_bench(args) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == 9 and report["errors"] == 0
    assert {body["max_tokens"] for body in fake_peer.requests} == {12}  # --answer-tokens
    for body in fake_peer.requests:  # every round re-sent the peer's own earlier answers
        answers = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
        assert answers == [reply_for(body["messages"][: 2 * t + 2]) for t in range(len(answers))]
    meta = report["meta"]
    assert (meta["workload"], meta["num_users"], meta["num_rounds"], meta["qps"]) == ("multiround", 3, 3, 50.0)
    assert (meta["history_tokens"], meta["answer_tokens"], meta["concurrency"]) == (300, 12, None)
    rounds = report["per_round"]
    assert [r["turn"] for r in rounds] == [0, 1, 2] and all(r["requests"] == 3 for r in rounds)
    assert all(r["ttft_p50_s"] > 0 and r["ttft_p99_s"] >= r["ttft_p50_s"] for r in rounds)
    assert all(r["cached_tokens"] == 3 * CACHED_TOKENS for r in rounds)
    later = [r for r in report["per_request"] if r["turn"] > 0]
    assert all(r["achievable_cached_tokens"] > 300 for r in later)  # the user's history at least
    for r in rounds[1:]:
        assert r["hit_efficiency"] == pytest.approx(r["cached_tokens"] / r["achievable_cached_tokens"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-users", "0"], "--num-users"),
        (["--num-rounds", "9"], "--num-rounds"),  # past the 4096-token context
        (["--qps", "0"], "--qps"),
        (["--concurrency", "0"], "--concurrency"),
        (["--answer-tokens", "0"], "--answer-tokens"),
    ],
)
def test_bad_flags_exit_2_before_any_request(
    argv: list[str], message: str, tokenizer_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(["--url", "http://127.0.0.1:9", "--tokenizer", tokenizer_path, *argv])
    assert run_bench(args) == 2
    assert message in capsys.readouterr().err
