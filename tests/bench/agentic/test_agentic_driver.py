"""The agentic driver and the `bench agentic` command, end to end against the test-double peer."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest

from _fake_openai_peer import CACHED_TOKENS, FakePeer, reply_for
from kvstrata.bench.agentic.driver import RequestRecord, drive_agentic
from kvstrata.bench.agentic.workload import AgenticConfig, AgenticWorkload, generate_agentic
from kvstrata.bench.args import default_tokenizer
from kvstrata.bench.cli import add_bench_parser, run_bench
from kvstrata.bench.client import ChatClient

SMALL = AgenticConfig(agents=1, sessions=3, turns=3, system_tokens=800, turn_tokens=30)


def drive(
    peer: FakePeer, workload: AgenticWorkload, model: str = "ok",
    concurrency: int | None = 2, rate: float | None = None,
) -> list[RequestRecord]:
    async def run() -> list[RequestRecord]:
        async with ChatClient(peer.url, model, max_tokens=8) as client:
            return await drive_agentic(workload, client, concurrency, rate, progress=False)

    return asyncio.run(run())


def test_sessions_interleave_and_resend_the_real_replies(fake_peer: FakePeer) -> None:
    fake_peer.reset()
    workload = generate_agentic(SMALL)
    records = drive(fake_peer, workload, concurrency=2)
    assert len(records) == 9 and all(r.result.ok for r in records)
    assert fake_peer.max_in_flight <= 2
    for r in records:
        replies = [reply_for(r.messages[: 2 * t + 2]) for t in range(r.turn)]
        assert r.messages == workload.messages(r.session_id, replies)  # the peer's own replies
    sent = [(r.session_id, r.turn) for r in sorted(records, key=lambda r: r.result.t_sent)]
    # FIFO slots: session 2's first turn goes before session 0's second, so histories interleave
    assert sent[:3] == [(0, 0), (1, 0), (2, 0)]

def test_poisson_arrivals_drive_every_turn(fake_peer: FakePeer) -> None:
    records = drive(fake_peer, generate_agentic(SMALL), concurrency=None, rate=200.0)
    assert sorted((r.session_id, r.turn) for r in records) == [(s, t) for s in range(3) for t in range(3)]
    assert all(r.result.ok for r in records)


def test_a_failed_request_ends_its_session(fake_peer: FakePeer) -> None:
    records = drive(fake_peer, generate_agentic(SMALL), model="fail")
    assert sorted((r.session_id, r.turn) for r in records) == [(0, 0), (1, 0), (2, 0)]
    assert all(not r.result.ok for r in records)


def test_bench_agentic_command(fake_peer: FakePeer, tokenizer_path: str, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "agentic.json"
    args = parser.parse_args([
        "bench", "agentic", "--url", fake_peer.url, "--model", "ok", "--tokenizer", tokenizer_path,
        "--sessions", "4", "--agents", "2", "--turns", "2", "--system-tokens", "800",
        "--turn-tokens", "40", "--max-tokens", "8", "--concurrency", "3", "--output", str(out),
    ])
    assert run_bench(args) == 0
    report = json.loads(out.read_text())
    assert report["requests"] == 8 and report["errors"] == 0
    assert report["cached_tokens"] == 8 * CACHED_TOKENS
    assert report["meta"]["sessions"] == 4 and report["meta"]["concurrency"] == 3
    rows = report["per_request"]
    assert sum(row["achievable_cached_tokens"] > 0 for row in rows if row["turn"] == 1) == 4
    assert report["hit_efficiency"] == report["cached_tokens"] / report["achievable_cached_tokens"]
    assert report["ttft_s"]["first_turn"]["p50"] > 0 and report["ttft_s"]["later_turns"]["p99"] > 0


def test_bad_parameters_exit_2(tokenizer_path: str) -> None:
    parser = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "agentic", "--turns", "1", "--tokenizer", tokenizer_path])
    assert run_bench(args) == 2


def test_main_cli_routes_bench_agentic() -> None:
    from kvstrata.cli import build_parser

    ns = build_parser().parse_args(["bench", "agentic", "--sessions", "2", "--request-rate", "1.5"])
    assert ns.func is run_bench and ns.bench_command == "agentic"
    assert (ns.sessions, ns.request_rate, ns.page_size, ns.url) == (2, 1.5, 16, "http://127.0.0.1:8000")


def test_default_tokenizer_follows_kvstrata_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVSTRATA_HOME", str(tmp_path))
    assert default_tokenizer() == str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
