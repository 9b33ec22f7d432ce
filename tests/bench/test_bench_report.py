"""The summary: every documented field, computed from hand-made request records."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstrata.bench.achievable import prompt_token_ids
from kvstrata.bench.agentic.driver import RequestRecord
from kvstrata.bench.agentic.workload import AgenticConfig, generate_agentic
from kvstrata.bench.client import ChatResult
from kvstrata.bench.report import build_report, format_table, percentile, write_json

FIELDS = {
    "meta", "requests", "errors", "first_error", "prompt_tokens", "output_tokens", "cached_tokens",
    "cached_tokens_reported_requests", "achievable_cached_tokens", "hit_efficiency",
    "prompt_tokens_mismatch", "ttft_s", "e2e_s", "duration_s", "output_tokens_per_s", "per_request",
}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def make_records(tokenizer: Any, cached: list[int | None]) -> list[RequestRecord]:
    """Two sessions of one agent, two turns each, sequential: s0t0, s1t0, s0t1, s1t1."""
    w = generate_agentic(AgenticConfig(agents=1, sessions=2, turns=2, system_tokens=800, turn_tokens=40))
    replies = ["The first answer is here", "Another answer"]
    plan = [(0, 0), (1, 0), (0, 1), (1, 1)]
    records = []
    for i, (session, turn) in enumerate(plan):
        messages = w.messages(session, replies[session : session + 1] if turn else [])
        n_prompt = len(prompt_token_ids(tokenizer, messages))
        t = 10.0 + i
        res = ChatResult(
            text=replies[session], t_sent=t, t_done=t + 0.5, ttft_s=0.1 * (i + 1), finish_reason="stop",
            prompt_tokens=n_prompt, completion_tokens=5, cached_tokens=cached[i], content_chunks=5,
        )
        records.append(RequestRecord(session, 0, turn, "user", messages, res))
    return records


def test_report_fields_and_numbers(tokenizer: Any, tmp_path: Path) -> None:
    records = make_records(tokenizer, cached=[0, 800, 900, 900])
    report = build_report(records, tokenizer, page_size=16, meta={"workload": "agentic"})
    assert set(report) == FIELDS
    rows = report["per_request"]
    achievable = [row["achievable_cached_tokens"] for row in rows]
    ids = [prompt_token_ids(tokenizer, r.messages) for r in records]
    prompts = [len(x) for x in ids]
    reply0 = tokenizer.encode("The first answer is here", add_special_tokens=False)
    assert achievable[0] == 0
    assert achievable[1] == common_prefix(ids[0], ids[1]) // 16 * 16 > 800  # the shared system prompt
    assert achievable[2] == (prompts[0] + len(reply0)) // 16 * 16  # s0's first prompt + reply
    assert report["requests"] == 4 and report["errors"] == 0 and report["first_error"] is None
    assert report["prompt_tokens"] == sum(prompts) and report["prompt_tokens_mismatch"] == 0
    assert report["cached_tokens"] == 2600 and report["cached_tokens_reported_requests"] == 4
    assert report["achievable_cached_tokens"] == sum(achievable)
    assert report["hit_efficiency"] == pytest.approx(2600 / sum(achievable))
    assert report["ttft_s"]["first_turn"]["p50"] == pytest.approx(0.15)  # 0.1 and 0.2
    assert report["ttft_s"]["later_turns"]["p90"] == pytest.approx(0.39)  # 0.3 and 0.4
    assert report["ttft_s"]["later_turns"]["mean"] == pytest.approx(0.35)
    assert report["e2e_s"] == {"p50": pytest.approx(0.5), "p99": pytest.approx(0.5)}
    assert report["duration_s"] == pytest.approx(3.5)
    assert report["output_tokens"] == 20 and report["output_tokens_per_s"] == pytest.approx(20 / 3.5)
    assert [row["t_sent_s"] for row in rows] == [0.0, 1.0, 2.0, 3.0]
    out = tmp_path / "report.json"
    write_json(report, str(out))
    assert json.loads(out.read_text())["hit_efficiency"] == pytest.approx(report["hit_efficiency"])
    table = format_table(report)
    assert "hit efficiency" in table and "TTFT later turns mean/p50/p90/p99 ms" in table


def test_missing_cached_tokens_and_errors(tokenizer: Any) -> None:
    records = make_records(tokenizer, cached=[None, None, None, None])
    failed = replace(records[3].result, text="", ttft_s=None, finish_reason=None, prompt_tokens=None,
                     completion_tokens=None, content_chunks=0, error="HTTP 500: boom")
    records[3] = replace(records[3], result=failed)
    odd = replace(records[1].result, prompt_tokens=3, completion_tokens=None)
    records[1] = replace(records[1], result=odd)
    report = build_report(records, tokenizer, page_size=16, meta={})
    assert report["cached_tokens"] is None and report["hit_efficiency"] is None
    assert report["errors"] == 1 and report["first_error"] == "HTTP 500: boom"
    assert report["prompt_tokens_mismatch"] == 1  # the server said 3, the template says otherwise
    reply_tokens = len(tokenizer.encode("Another answer", add_special_tokens=False))
    assert report["output_tokens"] == 5 + reply_tokens + 5  # a missing count comes from the text
    assert report["ttft_s"]["later_turns"]["p50"] == pytest.approx(0.3)  # errors are left out
    table = format_table(report)
    assert "n/a" in table and "first error" in table


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)
    rng = random.Random(0)
    for n in (2, 7, 100):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
