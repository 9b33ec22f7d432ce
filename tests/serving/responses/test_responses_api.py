"""/v1/responses on the tiny model with the real openai client: function calls (forced, so a
random-weight model makes valid ones), previous_response_id chaining through the prefix cache,
the streamed event sequence, and 400s naming unsupported fields; then the request as Codex CLI sends
it, on the thinking template (thinking_model.py): reasoning items round-tripped with store false,
streamed reasoning events, namespace tools, hosted tools dropped, thinking turned off."""
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
from kvstrata.serving.responses.reasoning_items import encode_reasoning
from kvstrata.serving.responses.request import input_messages
from kvstrata.serving.server import ServerThread
from polling import wait_for
from serving_support import RecordingEngine, assert_error, make_state, openai_client, serve
from thinking_model import ScriptedEngine

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
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"budget": 5}}, "reasoning.budget"),
    ({"input": "hi", "text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"input": "hi", "include": ["reasoning.encrypted_content", "code_interpreter_call.outputs"]}, "include"),
    ({"input": "hi", "include": ["message.output_text.logprobs"], "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "include"),
    ({"input": "hi", "top_logprobs": 21}, "top_logprobs"),
    ({"input": "hi", "service_tier": "gold"}, "service_tier"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "include": ["file_search_call.results"]}, "include"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "teleport"}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "teleport"}]}]},
     "tools[0].tools[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}, {"type": "namespace", "name": "ns", "tools": [
        {"type": "function", "name": "ok"}, {"type": "function", "name": "x", "parameters": {"type": "array"}}]}]},
     "tools[1].tools[1].parameters"),
    ({"input": "hi", "tool_choice": {"type": "web_search"}, "tools": [{"type": "web_search"}]}, "tool_choice"),
    ({"input": "hi", "tools": [{"type": "function", "name": "a__b"},  # a namespaced tool's name, taken
                               {"type": "namespace", "name": "a", "tools": [{"type": "function", "name": "b"}]}]},
     "tools[1].tools[0].name"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAAAforged"}]},
     "input[0].encrypted_content"),
    ({"input": [{"type": "reasoning", "summary": [], "content": [{"type": "image"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": [{"type": "message", "role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]}, "input[0].call_id"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),  # forced, with no tools to force
    ({"input": "hi", "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "answer"}}}, "text.format.schema"),
])
def test_unsupported_or_bad_fields_get_a_400_naming_them(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert_error(http.post("/v1/responses", json=body), 400, param)


def test_openai_client_raises_on_unsupported(server: ServerThread, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError):
        openai_client(server).responses.create(model=model_name, input="hi", include=["file_search_call.results"])


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


# --- as Codex CLI sends it: reasoning items with store false, namespace and hosted tools ------------------

NAMESPACED = [
    {"type": "function", "name": "exec_command", "strict": False, "description": "Run a command",
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "spawn_agent", "strict": False, "description": "Spawn one",
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}},
        {"type": "custom", "name": "exec",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    ]},
    {"type": "web_search", "external_web_access": False},
]
CODEX: dict[str, Any] = {  # the fields Codex CLI 0.171.0 sends (captured), ids and metadata shortened
    "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "019a-thread", "text": {"verbosity": "low"},
    "tools": NAMESPACED, "extra_body": {"client_metadata": {"session_id": "019a", "turn_id": "019b"}},
}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_reasoning_items_round_trip_with_store_false(thinking_engine: AsyncEngine) -> None:
    """The thinking template's generation prompt opens <think>: the random reply is all reasoning."""
    model = thinking_engine.served_model_name
    with serve(make_state(thinking_engine)) as srv:
        client = openai_client(srv, timeout=120)
        turn1 = [_user("plan a trip to " + ", ".join(f"city {k}" for k in range(30)))]
        r1 = client.responses.create(model=model, input=turn1, max_output_tokens=12, temperature=0,
                                     **{k: v for k, v in CODEX.items() if k != "tools"})
        item = r1.output[0]
        assert item.type == "reasoning" and item.id.startswith("rs_") and item.summary == []
        assert item.content and item.content[0].type == "reasoning_text" and item.encrypted_content
        assert r1.usage is not None and r1.usage.output_tokens_details.reasoning_tokens == r1.usage.output_tokens
        turn2 = turn1 + [o.model_dump(exclude_none=True) for o in r1.output] + [_user("and then?")]
        r2 = client.responses.create(model=model, input=turn2, max_output_tokens=4, temperature=0, store=False)
        # every page before turn 1's last prompt token (the reply may re-tokenize into it) comes from the cache
        assert r2.usage is not None
        assert r2.usage.input_tokens_details.cached_tokens >= (r1.usage.input_tokens - 1) // 16 * 16 > 0
    scripted = ScriptedEngine(thinking_engine, ["ok"])
    with serve(make_state(scripted)) as srv:
        openai_client(srv).responses.create(model=model, input=turn2, store=False)
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert f"<|im_start|>assistant\n<think>\n{item.content[0].text}</think>\n\n<|im_end|>" in prompt


def test_streamed_reasoning_comes_first_as_openai_streams_it(thinking_engine: AsyncEngine) -> None:
    scripted = ScriptedEngine(thinking_engine, ["let me ", "think</think>\n\n", "Hi ", "there"])
    with serve(make_state(scripted)) as srv:
        events = list(openai_client(srv).responses.create(model=thinking_engine.served_model_name,
                                                          input="hi", stream=True, **CODEX))
    kinds = [e.type for e in events]
    assert kinds[:6] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.reasoning_text.delta", "response.reasoning_text.delta",
                         "response.reasoning_text.done"]
    assert kinds.index("response.output_item.done") < kinds.index("response.output_text.delta")
    reasoning, message = events[-1].response.output
    assert reasoning.content[0].text == "let me think" and reasoning.encrypted_content
    assert message.content[0].text == "Hi there"


@pytest.mark.parametrize("stream", [False, True])
def test_namespace_tool_calls_answer_with_their_namespace_and_hosted_tools_are_dropped(
    thinking_engine: AsyncEngine, stream: bool,
) -> None:
    call = '<tool_call>\n{"name": "multi_agent_v1__spawn_agent", "arguments": {"task": "x"}}\n</tool_call>'
    scripted = ScriptedEngine(thinking_engine, ["</think>", call])
    with serve(make_state(scripted)) as srv:
        client = openai_client(srv)
        r = client.responses.create(model=thinking_engine.served_model_name, input="go", stream=stream, **CODEX)
        output = list(r)[-1].response.output if stream else r.output
        [fc] = [o for o in output if o.type == "function_call"]
        assert (fc.namespace, fc.name, json.loads(fc.arguments)) == ("multi_agent_v1", "spawn_agent", {"task": "x"})
        back = [_user("go"), fc.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": fc.call_id, "output": "spawned"}]
        client.responses.create(model=thinking_engine.served_model_name, input=back, **CODEX)
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert '"name": "multi_agent_v1__spawn_agent"' in prompt and "Sub-agents.\\n\\nSpawn one" in prompt
    assert "web_search" not in prompt and '"exec"' not in prompt and '{"name": "multi_agent_v1__spawn_agent", ' \
        '"arguments": {"task": "x"}}' in prompt


def test_effort_none_turns_thinking_off(thinking_engine: AsyncEngine) -> None:
    scripted = ScriptedEngine(thinking_engine, ["plain</think> answer"])
    with serve(make_state(scripted)) as srv:
        r = openai_client(srv).responses.create(model=thinking_engine.served_model_name, input="hi",
                                                reasoning={"effort": "none"})
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].text == "plain</think> answer"
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_codex_additional_tools_items_add_their_tools(thinking_engine: AsyncEngine) -> None:
    """What Codex sends for some models instead of `tools`: an input item holding namespaces of tools."""
    extra = {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
        {"type": "namespace", "name": "functions", "description": "", "tools": [
            {"type": "custom", "name": "exec", "description": "Run JavaScript"},
            {"type": "function", "name": "wait", "strict": False,
             "parameters": {"type": "object", "properties": {}}}]}]}
    scripted = ScriptedEngine(thinking_engine, ["ok"])
    body = {"input": [extra, _user("hi")], "stream": True, "reasoning": {"effort": "low", "context": "all_turns"},
            "text": {"verbosity": "low"}, "service_tier": "auto", "parallel_tool_calls": False, "store": False,
            "client_metadata": {"x-codex-window-id": "w"}}
    with serve(make_state(scripted)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.post("/v1/responses", json=body).status_code == 200
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert '"name": "functions__wait"' in prompt and "JavaScript" not in prompt


def test_a_stored_reply_keeps_its_reasoning_for_previous_response_id(thinking_engine: AsyncEngine) -> None:
    scripted = ScriptedEngine(thinking_engine, ["think", "</think>\n\nanswer"])
    with serve(make_state(scripted)) as srv:
        client = openai_client(srv)
        r1 = client.responses.create(model=thinking_engine.served_model_name, input="hi")
        assert [o.type for o in r1.output] == ["reasoning", "message"] and r1.output[0].encrypted_content is None
        client.responses.create(model=thinking_engine.served_model_name, input="more", previous_response_id=r1.id)
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert "<|im_start|>assistant\n<think>\nthink</think>\n\nanswer<|im_end|>\n<|im_start|>user\nmore" in prompt


def test_input_items_become_the_chat_messages_of_each_reply() -> None:
    thought = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "a"}],
               "encrypted_content": encode_reasoning("plan")}  # ours wins over the content
    call = {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "namespace": "ns", "arguments": "{}"}
    reply = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "on it"}]}
    result = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    items = [_user("go"), thought, reply, call, result, {**thought, "encrypted_content": None}, _user("next")]
    assert input_messages(items) == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "on it", "reasoning_content": "plan", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ns__spawn_agent", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "", "reasoning_content": "a"},  # reasoning with no reply after it
        {"role": "user", "content": "next"},
    ]


def test_output_text_logprobs_equal_the_chat_routes(server: ServerThread, model_name: str) -> None:
    """include message.output_text.logprobs: the message's tokens, as chat's logprobs give them, whole and
    streamed (each delta carries its tokens')."""
    client = openai_client(server)
    # sampled with a seed: the random model's greedy reply here is blank lines, which open no streamed message
    kw: dict[str, Any] = dict(model=model_name, input="Say something about the sea.", max_output_tokens=6,
                              temperature=1, include=["message.output_text.logprobs"], top_logprobs=2,
                              extra_body={"seed": 7})
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say something about the sea."}],
                                          max_tokens=6, temperature=1, seed=7, logprobs=True, top_logprobs=2
                                          ).choices[0].logprobs.content
    whole = client.responses.create(**kw).output[0].content[0].logprobs
    want = [(c.token, round(c.logprob, 5), [(t.token, round(t.logprob, 5)) for t in c.top_logprobs]) for c in chat]
    assert [(c.token, round(c.logprob, 5), [(t.token, round(t.logprob, 5)) for t in c.top_logprobs]) for c in whole] \
        == want and len(want) >= 2
    events = list(client.responses.create(stream=True, **kw))
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done").logprobs
    assert [(c.token, round(c.logprob, 5)) for c in done] == [w[:2] for w in want]
    assert [(c.token, round(c.logprob, 5)) for c in deltas] == [w[:2] for w in want][: len(deltas)]
    no = client.responses.create(model=model_name, input="hi", max_output_tokens=2)
    assert no.output[0].content[0].logprobs == []
