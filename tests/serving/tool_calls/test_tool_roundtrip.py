"""Assistant tool calls and tool results round-trip into the next turn's prompt without breaking its
prefix: turn 2's prompt tokens start with turn 1's prompt tokens + reply tokens, so the prefix cache
serves them. SmolLM2's tokenizer and template (no tool syntax: the `json` fallback)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstrata.model.tokenizer import Tokenizer
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.tool_calls.plan import plan_tools

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# recorded from SmolLM2 (float32, greedy, tool_choice "required") through kvstrata serve
REPLY = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_path(smollm2_path)


def prompt_ids(tokenizer: Tokenizer, messages: list[dict[str, Any]], **fields: Any) -> list[int]:
    req = ChatCompletionRequest.model_validate({"messages": messages, "tools": TOOLS, **fields})
    plan = plan_tools(req, tokenizer, "auto")
    return tokenizer.encode(tokenizer.apply_chat_template(plan.messages, tools=plan.template_tools))


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_turn_two_starts_with_turn_one_and_its_reply(tokenizer: Tokenizer, system: str | None) -> None:
    head = [{"role": "system", "content": system}] if system else []
    turn1 = [*head, {"role": "user", "content": "What is the weather in Paris?"}]
    ids1 = prompt_ids(tokenizer, turn1, tool_choice="required")
    reply = tokenizer.encode(REPLY)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turn2 = [*turn1, {"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    ids2 = prompt_ids(tokenizer, turn2)
    assert ids2[: len(ids1) + len(reply)] == ids1 + reply
    eos = tokenizer.eos_token_ids
    assert ids2[len(ids1) + len(reply)] in eos  # then the end of turn the model would have sampled
    turn3 = [*turn2, {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks"}]
    ids3 = prompt_ids(tokenizer, turn3)
    assert ids3[: len(ids2)] == ids2


def test_tool_choice_none_hides_the_tools(tokenizer: Tokenizer) -> None:
    user = [{"role": "user", "content": "hi"}]
    assert len(prompt_ids(tokenizer, user, tool_choice="none")) < len(prompt_ids(tokenizer, user))
