"""The agentic workload: seeded, the requested shape, token counts a real tokenizer agrees with."""
from __future__ import annotations

import json
from typing import Any

import pytest

from kvstrata.bench.agentic.workload import AgenticConfig, generate_agentic
from kvstrata.bench.text import approx_tokens


def n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_same_seed_same_workload_other_seed_differs() -> None:
    config = AgenticConfig(agents=2, sessions=4, turns=5, system_tokens=1000, turn_tokens=60, seed=3)
    assert generate_agentic(config) == generate_agentic(config)
    other = generate_agentic(AgenticConfig(agents=2, sessions=4, turns=5, system_tokens=1000, turn_tokens=60, seed=4))
    assert other.agents[0].system_prompt != generate_agentic(config).agents[0].system_prompt


def test_agents_do_not_depend_on_the_number_of_sessions() -> None:
    few = generate_agentic(AgenticConfig(agents=2, sessions=2, turns=2))
    many = generate_agentic(AgenticConfig(agents=2, sessions=10, turns=4))
    assert few.agents == many.agents
    assert few.sessions[1].turns[0] == many.sessions[1].turns[0]


def test_shape_sessions_turns_agents() -> None:
    w = generate_agentic(AgenticConfig(agents=3, sessions=7, turns=4, system_tokens=900, turn_tokens=50))
    assert len(w.agents) == 3 and len(w.sessions) == 7 and w.num_requests == 28
    assert [s.agent_id for s in w.sessions] == [0, 1, 2, 0, 1, 2, 0]
    assert len({a.system_prompt for a in w.agents}) == 3
    for s in w.sessions:
        assert len(s.turns) == 4 and s.turns[0].kind == "user"
        assert {t.kind for t in s.turns} <= {"user", "tool_result"}
    kinds = [t.kind for s in w.sessions for t in s.turns[1:]]
    assert "tool_result" in kinds and "user" in kinds
    assert len({t.content for s in w.sessions for t in s.turns}) == 28  # every turn is distinct


def test_system_prompt_holds_valid_tool_schemas() -> None:
    agent = generate_agentic(AgenticConfig(sessions=1, system_tokens=2000)).agents[0]
    block = agent.system_prompt.split("<tools>\n")[1].split("</tools>")[0]
    tools = [json.loads(line) for line in block.splitlines()]
    assert [t["function"]["name"] for t in tools] == list(agent.tool_names)
    assert len(set(agent.tool_names)) == len(tools) >= 3
    for tool in tools:
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])


@pytest.mark.parametrize(("system_tokens", "turn_tokens"), [(800, 20), (1500, 100), (4000, 200)])
def test_token_counts_within_25_percent(tokenizer: Any, system_tokens: int, turn_tokens: int) -> None:
    config = AgenticConfig(agents=2, sessions=4, turns=12, system_tokens=system_tokens, turn_tokens=turn_tokens)
    w = generate_agentic(config)
    for agent in w.agents:
        assert abs(n_tokens(tokenizer, agent.system_prompt) / system_tokens - 1) <= 0.25
    for session in w.sessions:
        for turn in session.turns:
            assert abs(n_tokens(tokenizer, turn.content) / turn_tokens - 1) <= 0.25, turn
    real = sum(n_tokens(tokenizer, t.content) for s in w.sessions for t in s.turns)
    estimate = sum(approx_tokens(t.content) for s in w.sessions for t in s.turns)
    assert abs(real / estimate - 1) <= 0.15


def test_messages_rebuild_the_whole_history() -> None:
    w = generate_agentic(AgenticConfig(agents=1, sessions=2, turns=3, system_tokens=800, turn_tokens=30))
    s = w.sessions[1]
    assert w.messages(1, []) == [
        {"role": "system", "content": w.agents[0].system_prompt},
        {"role": "user", "content": s.turns[0].content},
    ]
    third = w.messages(1, ["first reply", "second reply"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [third[2]["content"], third[4]["content"], third[5]["content"]] == [
        "first reply", "second reply", s.turns[2].content,
    ]
    with pytest.raises(ValueError, match="only 3 turns"):
        w.messages(1, ["a", "b", "c"])


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"sessions": 65}, "--sessions"),
        ({"turns": 1}, "--turns"),
        ({"turns": 31}, "--turns"),
        ({"system_tokens": 500}, "--system-tokens"),
        ({"turn_tokens": 300}, "--turn-tokens"),
        ({"agents": 3, "sessions": 2}, "--agents"),
    ],
)
def test_out_of_shape_parameters_name_the_flag(kwargs: dict[str, int], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        generate_agentic(AgenticConfig(**kwargs))
