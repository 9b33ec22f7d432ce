"""bench/agents: the proxy reads usage in each API's spelling; the summary compares the right turns."""
from __future__ import annotations

import pytest

from kvstrata.bench.agents.command import Turn, summary
from kvstrata.bench.agents.proxy import usage_of


def test_usage_in_each_apis_spelling() -> None:
    anthropic = {"type": "message_delta", "usage": {"input_tokens": 4, "cache_read_input_tokens": 90,
                                                    "cache_creation_input_tokens": 6, "output_tokens": 3}}
    assert usage_of(anthropic) == (100, 90)
    assert usage_of({"type": "message_start", "message": {"usage": anthropic["usage"]}}) == (100, 90)
    responses = {"type": "response.completed", "response": {"usage": {
        "input_tokens": 100, "input_tokens_details": {"cached_tokens": 64}, "output_tokens": 5}}}
    assert usage_of(responses) == (100, 64)
    chat = {"usage": {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 32}}}
    assert usage_of(chat) == (50, 32)
    assert usage_of({"usage": {"prompt_tokens": 7, "prompt_tokens_details": None}}) == (7, 0)
    assert usage_of({"type": "ping"}) == (None, None)


def _turn(session: int, turn: int, ttft: float, cached: int, after: bool = False, engine: str = "e") -> Turn:
    return Turn(engine, "claude-code", session, turn, True, 1.0, 1, ttft, 1000, cached, after)


def test_the_summary_compares_new_sessions_and_the_restart_with_the_cold_turn() -> None:
    turns = [_turn(1, 1, 2.0, 0), _turn(1, 2, 0.2, 990), _turn(1, 3, 0.3, 980), _turn(2, 1, 0.5, 900),
             _turn(2, 2, 0.1, 995), _turn(3, 1, 0.4, 950, after=True), _turn(1, 1, 9.0, 0, engine="peer")]
    mine, peer = summary(turns)
    assert mine["cold_ttft_s"] == 2.0 and mine["later_ttft_p50_s"] == pytest.approx(0.2)
    assert mine["later_cached_share_p50"] == pytest.approx(0.99)
    assert mine["new_session_vs_cold"] == pytest.approx(0.25) and mine["after_restart_vs_cold"] == pytest.approx(0.2)
    assert peer["engine"] == "peer" and peer["later_ttft_p50_s"] is None and peer["errors"] == 0


def test_the_main_request_is_the_first_of_the_whole_prompt() -> None:
    from kvstrata.bench.agents.command import main_exchange
    from kvstrata.bench.agents.proxy import Exchange

    side, first, again = Exchange("/v1/messages", 0.0), Exchange("/v1/messages", 1.0), Exchange("/v1/messages", 2.0)
    side.prompt_tokens, first.prompt_tokens, again.prompt_tokens = 300, 12000, 12050
    assert main_exchange([side, first, again]) is first and main_exchange([]) is None
