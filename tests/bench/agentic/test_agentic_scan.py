"""`bench agentic --scan-prompts/--scan-tokens/--think-time/--cache-hints` against the test-double
peer: the scan runs beside the sessions and stays out of their figures, hints go on agent requests
only, think time separates a session's turns, and bad scan flags exit 2."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from _fake_openai_peer import FakePeer
from kvstrata.bench.agentic.scan import ScanConfig, session_hints
from kvstrata.bench.cli import add_bench_parser, run_bench


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "agentic", *argv])


def test_scan_beside_sessions_with_hints_and_think_time(fake_peer: FakePeer, tokenizer_path: str, tmp_path: Path) -> None:
    fake_peer.reset()
    out = tmp_path / "scan.json"
    args = parse("--url", fake_peer.url, "--model", "ok", "--tokenizer", tokenizer_path, "--sessions", "2",
                 "--turns", "2", "--system-tokens", "800", "--turn-tokens", "30", "--max-tokens", "8",
                 "--scan-prompts", "3", "--scan-tokens", "200", "--think-time", "0.3", "--cache-hints",
                 "--output", str(out))
    assert run_bench(args) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == 4 and report["meta"]["cache_hints"] and report["meta"]["think_time"] == 0.3
    agents = [b for b in fake_peer.requests if "prompt_cache_key" in b]
    scans = [b for b in fake_peer.requests if "prompt_cache_key" not in b]
    assert len(agents) == 4 and {b["prompt_cache_retention"] for b in agents} == {"24h"}
    assert len({b["prompt_cache_key"] for b in agents}) == 2  # one key per session
    assert 1 <= len(scans) <= 3 and report["scan"]["prompts"] == len(scans) and report["scan"]["failed"] == 0
    assert all(b["messages"][0]["content"].startswith(f"Document {i} ") for i, b in enumerate(scans))
    assert len({b["messages"][0]["content"] for b in scans}) == len(scans)  # every scan prompt is unique
    rows = report["per_request"]
    for s in (0, 1):  # the second turn waited the think time after the first one's reply
        first, second = (next(r for r in rows if r["session"] == s and r["turn"] == t) for t in (0, 1))
        assert second["t_sent_s"] - (first["t_sent_s"] + first["e2e_s"]) >= 0.3


def test_no_scan_flags_mean_no_hints(fake_peer: FakePeer, tokenizer_path: str) -> None:
    fake_peer.reset()
    args = parse("--url", fake_peer.url, "--model", "ok", "--tokenizer", tokenizer_path, "--sessions", "1",
                 "--turns", "2", "--system-tokens", "800", "--turn-tokens", "30", "--max-tokens", "8")
    assert run_bench(args) == 0
    assert len(fake_peer.requests) == 2 and not any("prompt_cache_key" in b for b in fake_peer.requests)
    assert session_hints(ScanConfig(), 0, 0) == {}


def test_bad_scan_flags_exit_2(tokenizer_path: str) -> None:
    for flags in (["--scan-prompts", "-1"], ["--scan-tokens", "50"], ["--think-time", "-2"]):
        assert run_bench(parse("--tokenizer", tokenizer_path, *flags)) == 2, flags
