"""`kvstrata analyze` on the cache-hostile workloads: it must name the moving part of each."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvstrata.analyze.analysis import analyze
from kvstrata.analyze.rendered import AnalyzeInputError, load_requests
from kvstrata.bench.agentic.hostile import TEMPLATES, hostile_requests
from kvstrata.cli import main
from kvstrata.model.tokenizer import Tokenizer
from kvstrata.serving.request_log import redact_body, redact_text


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_path(smollm2_path)


def _tok(base: Tokenizer, variant: str) -> Tokenizer:
    return Tokenizer(base.backend, TEMPLATES[variant], base.special_tokens) if variant in TEMPLATES else base


def test_stable_workload_has_no_divergence(tokenizer: Tokenizer) -> None:
    a = analyze(hostile_requests("stable", sessions=3, turns=4), tokenizer)
    assert (a.requests, a.sessions, a.agents) == (12, 3, 1)
    assert a.places == [] and a.lost_tokens == 0
    assert a.hit_rate > 0.8


@pytest.mark.parametrize(
    "variant, pattern, where",
    [
        ("timestamp", "volatile_id", "system message content"),
        ("tools_reordered", "tools_reordered", "system message content"),
        ("tools_field_reordered", "tools_reordered", "template markup"),
        ("reasoning_dropped", "reasoning_dropped", "assistant message content"),
        ("template_history", "template_history", "user message content"),
    ],
)
def test_names_the_moving_part(tokenizer: Tokenizer, variant: str, pattern: str, where: str) -> None:
    a = analyze(hostile_requests(variant, sessions=3, turns=4), _tok(tokenizer, variant))
    assert a.sessions == 3 and a.agents == 1  # the moving part splits neither sessions nor agents
    top = a.places[0]
    assert (top.pattern, top.where) == (pattern, where), top
    assert a.patterns == [pattern]
    assert a.lost_tokens > 0 and a.hit_rate_if_fixed > a.hit_rate  # fixing the pattern wins hits back
    d = top.example
    assert d.token_offset > 0 and d.lost_tokens > 0 and "⟦" in d.before and "⟦" in d.after
    assert d.advice


def test_timestamp_points_at_the_front_and_quotes_both_values(tokenizer: Tokenizer) -> None:
    a = analyze(hostile_requests("timestamp", sessions=2, turns=3), tokenizer)
    d = a.places[0].example
    assert d.location.message == 0 and d.location.offset < 60  # near the start of the system prompt
    assert d.token_offset < 40
    assert "2026-11-30T09:" in d.detail and "->" in d.detail
    assert a.hit_rate < 0.1


def test_redacted_log_still_finds_the_timestamp(tokenizer: Tokenizer) -> None:
    bodies = [redact_body(b) for b in hostile_requests("timestamp", sessions=2, turns=3)]
    text = json.dumps(bodies)
    assert "Current time" not in text and "agent 0" not in text  # words are gone
    a = analyze(bodies, tokenizer)
    assert a.patterns == ["volatile_id"] and a.sessions == 2


def test_redaction_keeps_lengths_kinds_and_equality() -> None:
    assert redact_text("Order 12345 shipped") == redact_text("Order 12345 shipped")
    red = redact_text("Order 12345 shipped")
    assert len(red) == len("Order 12345 shipped") and red[5] == " " and red[6:11].isdigit() and red[0].isupper()
    assert red[:5] != "Order"
    body = redact_body({"messages": [{"role": "user", "content": "secret plan"}], "temperature": 0,
                        "tools": [{"type": "function", "function": {"name": "get_x"}}]})
    assert body["messages"][0]["role"] == "user" and "secret" not in body["messages"][0]["content"]
    assert body["temperature"] == 0 and set(body["tools"][0]["function"]) == {"name"}


def test_cli_reads_a_request_log(tmp_path: Path, smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [json.dumps({"ts": 1.0, "endpoint": "chat", "body": b}) for b in hostile_requests("tools_reordered")]
    log.write_text("\n".join(lines) + "\n")
    out_json = tmp_path / "a.json"
    assert main(["analyze", str(log), "--tokenizer", str(smollm2_path), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "tools_reordered" in out and "advice:" in out and "achievable hit rate" in out
    assert json.loads(out_json.read_text())["places"][0]["pattern"] == "tools_reordered"


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"prompt": "hi"}\n')
    with pytest.raises(AnalyzeInputError, match="no chat requests"):
        load_requests(bad)


def test_sessions_follow_prompt_cache_key_when_present(tokenizer: Tokenizer) -> None:
    def body(user: str, key: str | None) -> dict:
        b = {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": user}]}
        return {**b, "prompt_cache_key": key} if key is not None else b

    # unrelated conversations: without keys each is its own session; the keys regroup them
    bodies = [body("alpha", "a"), body("beta", "b"), body("gamma", "a"), body("delta", None), body("eps", 7)]
    assert analyze([body("alpha", None), body("beta", None), body("gamma", None)], tokenizer).sessions == 3
    a = analyze(bodies, tokenizer)
    assert a.sessions == 4 and sorted(a.session_turns.values()) == [1, 1, 1, 2]  # a: 2, b, delta, eps (not a str)


def test_a_body_with_tools_renders_as_the_rank_renders_it(tokenizer: Tokenizer) -> None:
    """SmolLM2's template has no tool syntax: the rank writes the tools into the system message, and so must
    analyze, or a Claude Code log (20 tools, 12k tokens) reads as a 4k-token prompt."""
    from kvstrata.analyze.rendered import render
    from kvstrata.serving.protocol import ChatCompletionRequest
    from kvstrata.serving.tool_calls.plan import plan_tools

    tool = {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
    body = {"messages": [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "hi"}],
            "tools": [tool]}
    plan = plan_tools(ChatCompletionRequest.model_validate(body), tokenizer, "auto")
    rank = tokenizer.encode(tokenizer.apply_chat_template(plan.messages, add_generation_prompt=True,
                                                          tools=plan.template_tools))
    assert render(tokenizer, body, 0).ids == rank and "read_file" in tokenizer.decode(rank)
