"""A real OpenAI Agents SDK agent against a real `kvstrata serve` on SmolLM2, over /v1/responses.

The agent has two function tools and a structured final output (the SDK sends it as
`text.format` json_schema). Each user turn: a call forced by `tool_choice: "required"` (constrained
decoding), the SDK runs the tool and sends its result back, then the model answers in the output
schema (constrained too). Three turns chained with `previous_response_id`, the last one streamed;
turns 2 and 3 find their prompt's prefix in the cache."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import pytest
from pydantic import BaseModel, Field

from agent_cli_support import kvstrata_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def serve_url(smollm2_path: Path) -> Iterator[str]:
    with kvstrata_serve(smollm2_path, "--max-total-tokens", "8192", name="smollm2", context=None,
                        start_timeout_s=300) as url:
        yield url


class Answer(BaseModel):
    answer: str = Field(max_length=40)


def test_agent_calls_tools_and_answers_over_three_turns(serve_url: str) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[tuple[str, Any]] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        called.append(("get_weather", city))
        return f"18 C and sunny in {city}"

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        called.append(("add", (a, b)))
        return a + b

    client = AsyncOpenAI(base_url=f"{serve_url}/v1", api_key="unused", max_retries=0, timeout=600)
    agent = Agent(
        name="assistant", instructions="You are a helpful assistant. Use the tools, then answer briefly.",
        tools=[get_weather, add], output_type=Answer,
        model=OpenAIResponsesModel(model="smollm2", openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0),
    )
    questions = ["What is the weather in Paris?", "What is 12 plus 30?", "And the weather in Rome?"]

    async def run() -> list[Any]:
        results, previous = [], None
        for k, question in enumerate(questions):
            if k < 2:
                result = await Runner.run(agent, question, previous_response_id=previous)
            else:
                result = Runner.run_streamed(agent, question, previous_response_id=previous)
                async for _ in result.stream_events():
                    pass
            results.append(result)
            previous = result.last_response_id
        return results

    results = asyncio.run(run())
    assert len(called) >= 3, called  # a tool ran in each turn, with arguments the SDK could parse
    assert {name for name, _ in called} <= {"get_weather", "add"}
    for k, result in enumerate(results):
        assert isinstance(result.final_output, Answer), result.final_output
        kinds = [item.type for item in result.new_items]
        assert "tool_call_item" in kinds and "tool_call_output_item" in kinds, kinds
        usages = [r.usage for r in result.raw_responses]
        assert len(usages) >= 2  # the call, then the answer after the tool's result
        cached = [u.input_tokens_details.cached_tokens for u in usages]
        if k > 0:
            assert cached[0] > 0, cached  # the chained prompt starts with the previous turns
        assert cached[-1] > 0, cached  # the answer's prompt starts with the call's prompt and reply


class Address(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


class Trip(BaseModel):
    traveller: str = Field(max_length=20)
    destination: Address
    nights: int = Field(ge=1, le=30)


def test_agent_forced_to_a_tool_with_nested_pydantic_parameters(serve_url: str) -> None:
    """The SDK writes nested models as `$defs` with `#/$defs/...` refs; forced by `tool_choice`,
    that schema is nested under the call's `arguments` (it got a 400 before the defs were hoisted)."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    booked: list[Trip] = []

    @function_tool
    def book_trip(trip: Trip) -> str:
        """Book a trip for a traveller."""
        booked.append(trip)
        return f"booked {trip.nights} nights in {trip.destination.city}"

    assert "$defs" in book_trip.params_json_schema  # what the SDK sends
    client = AsyncOpenAI(base_url=f"{serve_url}/v1", api_key="unused", max_retries=0, timeout=600)
    agent = Agent(
        name="booker", instructions="Book the trip the user asks for.", tools=[book_trip],
        model=OpenAIResponsesModel(model="smollm2", openai_client=client),
        model_settings=ModelSettings(tool_choice="book_trip", max_tokens=96, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(agent, "Book 3 nights in Lisbon, Portugal for Ana."))
    assert len(booked) == 1 and isinstance(booked[0].destination, Address)  # arguments the SDK validated
    assert result.final_output == f"booked {booked[0].nights} nights in {booked[0].destination.city}"
