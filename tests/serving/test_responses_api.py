"""/v1/responses on the tiny model with the real openai client: function calls (forced, so a
random-weight model makes valid ones), previous_response_id chaining through the prefix cache,
the streamed event sequence, and 400s naming unsupported fields."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import httpx
import openai
import pytest

from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.server import ServerThread
from polling import wait_for
from serving_support import RecordingEngine, assert_error, make_state, openai_client, serve

TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "strict": True,
                     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                    "required": ["city"], "additionalProperties": False}}]
BASE: dict[str, Any] = {"instructions": "Be brief.", "tools": TOOLS, "temperature": 0}


def test_forced_call_then_chained_answer(server: ServerThread, model_name: str) -> None:
    client = openai_client(server, timeout=120)
    r1 = client.responses.create(model=model_name, input="Weather in Paris?", tool_choice="required",
                                 max_output_tokens=40, **BASE)
    assert r1.status == "completed"
    (call,) = r1.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"}
    r2 = client.responses.create(model=model_name, previous_response_id=r1.id, max_output_tokens=4,
                                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
                                 **BASE)
    assert r2.previous_response_id == r1.id and r2.output[0].type == "message"
    assert r2.usage is not None and r1.usage is not None
    # the chained prompt starts with turn 1's prompt and call: whole pages of it come from the cache
    assert r2.usage.input_tokens_details.cached_tokens >= (r1.usage.input_tokens // 16) * 16 > 0


def test_streamed_events(server: ServerThread, model_name: str) -> None:
    client = openai_client(server, timeout=120)
    events = list(client.responses.create(model=model_name, input="Weather in Rome?", tool_choice="required",
                                          max_output_tokens=40, stream=True, **BASE))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response.output[0]
    assert final.arguments == args and set(json.loads(args)) == {"city"}


@pytest.mark.parametrize("body, param", [
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "include": ["file_search_call.results"]}, "include"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": [{"type": "message", "role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]}, "input[0].call_id"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].function.name"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),  # forced, with no tools to force
    ({"input": "hi", "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "answer"}}}, "text.format.schema"),
])
def test_unsupported_or_bad_fields_get_a_400_naming_them(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert_error(http.post("/v1/responses", json=body), 400, param)


def test_openai_client_raises_on_unsupported(server: ServerThread, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError):
        openai_client(server).responses.create(model=model_name, input="hi", reasoning={"effort": "high"})


class LateEngine(RecordingEngine):
    """Each output 0.6 s late: the reply outlasts the client's 0.5 s however soon the model ends it (the tiny
    random model's greedy reply reached EOS within that on the Xeon of 2026-12-05; the API has no ignore_eos)."""

    async def generate(self, request_id: str, ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        async for out in super().generate(request_id, ids, params):
            await asyncio.sleep(0.6)
            yield out


def test_a_client_that_leaves_aborts_its_non_streamed_response(engine: AsyncEngine, model_name: str) -> None:
    rec = LateEngine(engine)
    body = {"model": model_name, "input": "tell me a long story", "max_output_tokens": 1900, "temperature": 0}
    with serve(make_state(rec)) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
            http.post("/v1/responses", json=body)
        assert wait_for(lambda: bool(rec.ended), 60), "the request never ended"
        assert list(rec.ended.values()) == ["closed"], rec.ended  # aborted, not generated to the end
        assert wait_for(lambda: not engine.engine.has_unfinished(), 60)
