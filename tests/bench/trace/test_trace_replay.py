"""`kvstrata bench trace`: the live driver against a real kvstrata server on a tiny random-weight
model, the `--simulate` command, and the `compare --workload trace` registration."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvstrata.bench.cli import add_bench_parser, run_bench
from kvstrata.bench.compare.workloads import COMPARE_WORKLOADS
from kvstrata.bench.trace.format import load_trace
from kvstrata.bench.trace.tokens import BlockTokens
from kvstrata.serving.server import ServerThread

PS = 16  # the page size of the tiny_server fixture (tests/bench/conftest.py)
TRACE = [  # (timestamp ms, input_length, hash_ids): two conversations and a repeat
    (0, 1500, [1, 2, 3]),
    (2000, 2500, [1, 2, 3, 4, 5]),
    (4000, 1000, [7, 8]),
    (6000, 3000, [1, 2, 3, 4, 5, 6]),
    (8000, 1024, [7, 8]),
    (10000, 700, [9, 10]),
]


def write_trace(path: Path) -> Path:
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 5, "hash_ids": ids}) + "\n"
                            for t, n, ids in TRACE))
    return path


def bench(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstrata")
    add_bench_parser(parser.add_subparsers(dest="command"))
    return run_bench(parser.parse_args(["bench", *argv]))


def seen(prompts: list[list[int]], i: int) -> int:
    """Tokens of prompt i some earlier prompt starts with, the last one aside: a bound on what any cache
    can hit (full pages, then the tail a request left on the part page after them)."""
    best = 0
    for q in prompts[:i]:
        n = 0
        while n < min(len(prompts[i]) - 1, len(q)) and prompts[i][n] == q[n]:
            n += 1
        best = max(best, n)
    return best


def reachable(prompts: list[list[int]], i: int) -> int:
    """Tokens of prompt i a paged cache holding every earlier prompt's full pages can hit."""
    best = 0
    for q in prompts[:i]:
        n = 0
        while n < min(len(prompts[i]), len(q) // PS * PS) and prompts[i][n] == q[n]:
            n += 1
        best = max(best, n // PS * PS)
    return min(best, (len(prompts[i]) - 1) // PS * PS)


def test_live_replay_against_a_tiny_model_server(tiny_server: ServerThread, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "replay.json"
    code = bench(["trace", str(trace), "--url", tiny_server.base_url, "--model", tiny_server_model(tiny_server),
                  "--time-scale", "10", "--max-output-tokens", "3", "--output", str(out), "--no-plots"])
    assert code == 0
    report = json.loads(out.read_text())
    mp = BlockTokens(16)
    reqs = load_trace(trace)
    prompts = [mp.prompt(r) for r in reqs]
    assert report["errors"] == 0 and report["requests"] == len(TRACE)
    assert [row["prompt_tokens"] for row in report["rows"]] == [len(p) for p in prompts]  # ceil(L * 16 / 512)
    assert [row["completion_tokens"] for row in report["rows"]] == [3] * len(TRACE)  # ignore_eos, capped at 3
    for i, row in enumerate(report["rows"]):
        assert row["ttft_s"] is not None and row["ttft_s"] <= row["e2e_s"]
        assert 0 <= row["cached_tokens"] <= seen(prompts, i)  # never more than an earlier prompt shares
    page_ideal = sum(reachable(prompts, i) for i in range(len(prompts))) / sum(map(len, prompts))
    assert report["page_ideal_hit_rate"] == pytest.approx(page_ideal)
    assert 0 < report["hit_rate"] <= report["page_ideal_hit_rate"] <= report["ideal_hit_rate"]
    assert report["tpot_s"]["p50"] is not None and report["goodput"]["good_requests"] <= len(TRACE)
    assert (tmp_path / "replay.md").read_text().startswith("| hit rate")


def tiny_server_model(srv: ServerThread) -> str:
    import httpx

    return httpx.get(srv.base_url + "/v1/models", timeout=30).json()["data"][0]["id"]


def test_simulate_command_prints_the_ideal_at_unbounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "sim.json"
    assert bench(["trace", str(trace), "--simulate", "--block-tokens", "4", "--capacities", "48,48:48,48:48:inf,inf",
                  "--output", str(out), "--no-plots"]) == 0
    report = json.loads(out.read_text())
    ideal = report["meta"]["ideal_hit_rate"]
    rates = {r["capacity"]: r["hit_rate"] for r in report["results"]}
    assert rates["inf"] == ideal and rates["48"] <= rates["48:48"] <= rates["48:48:inf"] <= ideal
    assert f"**{ideal:.4f}**" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--capacities", "16"], "L1 must hold the longest request"),
    (["--capacities", "1k:0:1k"], "an L3 needs an L2"),
    (["--block-tokens", "0"], "--block-tokens must be in [1, 512]"),
    (["--start", "99"], "past the trace's 6 requests"),
])
def test_bad_flags_exit_2_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                      message: str) -> None:
    trace = write_trace(tmp_path / "t.jsonl")
    assert bench(["trace", str(trace), "--simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_trace_exits_2_naming_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    assert bench(["trace", str(trace), "--simulate"]) == 2
    assert "bad.jsonl:2: missing field 'input_length'" in capsys.readouterr().err


def test_compare_runs_trace_as_a_workload(tmp_path: Path) -> None:
    workload = COMPARE_WORKLOADS["trace"]
    assert workload.serve_args == {"kvstrata": ("--kv-cache-memory", "0.5", "--kvstore-ratio", "5")}
    parser = argparse.ArgumentParser()
    workload.add_arguments(parser)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    with pytest.raises(ValueError, match="--trace FILE is required"):
        workload.check(parser.parse_args([]))
    args = parser.parse_args(["--trace", str(write_trace(tmp_path / "t.jsonl")), "--max-requests", "2"])
    assert len(workload.check(args)) == 2  # type: ignore[arg-type]
