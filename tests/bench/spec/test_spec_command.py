"""`kvstrata bench spec` (kvstrata/bench/spec/command.py): the report against an OpenAI-style peer, and
the speculation counters read from kvstrata's and vLLM's /metrics."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from _fake_openai_peer import FakePeer

from kvstrata.bench.cli import add_bench_parser, run_bench
from kvstrata.bench.spec.command import REPLY_SLACK_TOKENS, spec_summary


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "spec", *argv])


def test_bench_spec_command(fake_peer: FakePeer, tmp_path: Path) -> None:
    fake_peer.reset()
    out = tmp_path / "edit.json"
    args = parse(["--url", fake_peer.url, "--model", "ok", "--edit-sessions", "3", "--edit-turns", "2",
                  "--doc-tokens", "100-200", "--edit-max-tokens", "50", "--output", str(out)])
    assert run_bench(args) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == 6 and report["errors"] == 0 and report["output_tokens"] > 0
    assert set(report["by_kind"]) == {"code", "json", "tool"}
    assert report["tpot_ms"]["p50"] > 0 and report["chunk_gap_ms"]["p99"] >= report["chunk_gap_ms"]["p50"]
    assert report["spec"]["mean_accepted_per_step"] is None  # the double exposes no speculation counters
    assert {body["max_tokens"] for body in fake_peer.requests} == {50}
    assert all(body["temperature"] == 0 for body in fake_peer.requests)


def test_a_reply_has_room_for_the_largest_document_by_default(fake_peer: FakePeer, tmp_path: Path) -> None:
    fake_peer.reset()
    args = parse(["--url", fake_peer.url, "--model", "ok", "--edit-sessions", "2", "--edit-turns", "1",
                  "--doc-tokens", "100-400", "--output", str(tmp_path / "edit.json")])
    assert run_bench(args) == 0
    assert {body["max_tokens"] for body in fake_peer.requests} == {400 * 5 // 4 + REPLY_SLACK_TOKENS}
    assert json.loads((tmp_path / "edit.json").read_text())["meta"]["max_tokens"] == 628


def test_speculation_counters_of_kvstrata_and_vllm() -> None:
    ours = spec_summary({"kvstrata:spec_decode_draft_tokens_total": 10.0},
                        {"kvstrata:spec_decode_draft_tokens_total": 110.0,
                         "kvstrata:spec_decode_accepted_tokens_total": 80.0,
                         "kvstrata:spec_decode_acceptance_length_count": 20.0})
    assert ours == {"drafted_tokens": 100.0, "accepted_tokens": 80.0, "mean_accepted_per_step": 4.0, "acceptance": 0.8}
    vllm = spec_summary({}, {"vllm:spec_decode_num_draft_tokens_total": 50.0,
                             "vllm:spec_decode_num_accepted_tokens_total": 30.0,
                             "vllm:spec_decode_num_drafts_total": 10.0})
    assert vllm["mean_accepted_per_step"] == 3.0 and vllm["acceptance"] == pytest.approx(0.6)


@pytest.mark.parametrize(("argv", "message"), [(["--edit-sessions", "0"], "--edit-sessions"),
                                                (["--doc-tokens", "big"], "--doc-tokens"),
                                                (["--edit-max-tokens", "0"], "--edit-max-tokens")])
def test_bad_flags_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(parse(["--url", "http://127.0.0.1:9", *argv])) == 2
    assert message in capsys.readouterr().err
