"""/v1/messages through the real `anthropic` SDK against the real server (a tiny random-weight model):
whole and streamed replies equal the chat route's (seeded) tokens, stop reasons, tools, count_tokens,
errors in Anthropic's shape, x-api-key tenants, thinking blocks (a scripted reply on a thinking template)."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.server import ServerThread
from serving_support import make_state, serve

WEATHER = {
    "name": "get_weather", "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HI = [{"role": "user", "content": "Say hello to the world."}]
GREEDY = {"temperature": 0}  # this SDK has no temperature argument; the API (and older clients) still send it
SEEDED = {"temperature": 1, "seed": 7}  # varied text from the random model (greedy repeats one token)


def _client(srv: ServerThread, key: str = "x") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.base_url, api_key=key, max_retries=0, timeout=30)


@pytest.fixture()
def claude(server: ServerThread) -> anthropic.Anthropic:
    return _client(server)


def _chat_text(client: openai.OpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int) -> str:
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
                                         extra_body=SEEDED)
    return out.choices[0].message.content or ""


def test_a_whole_reply_is_the_chat_routes_reply(claude: anthropic.Anthropic, client: openai.OpenAI,
                                                      model_name: str) -> None:
    msg = claude.messages.create(model=model_name, max_tokens=12, messages=HI, extra_body=SEEDED)  # type: ignore[arg-type]
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == _chat_text(client, model_name, HI, 12)
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert (msg.stop_reason == "max_tokens") == (msg.usage.output_tokens == 12)
    u = msg.usage
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert total == client.chat.completions.create(model=model_name, messages=HI, max_tokens=1).usage.prompt_tokens  # type: ignore[arg-type, union-attr]


def test_the_stream_is_anthropics_event_sequence_and_the_same_reply(claude: anthropic.Anthropic, server: ServerThread,
                                                                    model_name: str) -> None:
    whole = claude.messages.create(model=model_name, max_tokens=10, messages=HI, extra_body=SEEDED)  # type: ignore[arg-type]
    with claude.messages.stream(model=model_name, max_tokens=10, messages=HI, extra_body=SEEDED) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    body = {"model": model_name, "max_tokens": 10, "messages": HI, **SEEDED, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        kinds = [line[len("event: "):] for line in resp.iter_lines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    if whole.content:  # a block opens, the one ping follows, deltas, the block closes
        assert kinds[1:3] == ["content_block_start", "ping"] and kinds[3] == "content_block_delta"
        assert kinds[-3] == "content_block_stop"


def test_a_stop_sequence_ends_the_reply_and_is_named(claude: anthropic.Anthropic, client: openai.OpenAI,
                                                    model_name: str) -> None:
    text = client.chat.completions.create(model=model_name, messages=HI, max_tokens=16,  # type: ignore[arg-type]
                                          extra_body=SEEDED).choices[0].message.content or ""
    cut = text[6:9]
    assert len(set(text)) > 3 and len(cut) == 3, f"the seeded reply is too short or too plain to cut: {text!r}"
    msg = claude.messages.create(model=model_name, max_tokens=16, messages=HI, extra_body=SEEDED,  # type: ignore[arg-type]
                                 stop_sequences=["\u2603never", cut])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == cut
    got = "".join(b.text for b in msg.content if b.type == "text")
    assert got == text[:text.index(cut)]


def test_a_forced_tool_is_a_tool_use_block_whole_and_streamed(claude: anthropic.Anthropic, model_name: str) -> None:
    kwargs: dict[str, Any] = dict(model=model_name, max_tokens=64, messages=[{"role": "user", "content": "Paris?"}],
                                  tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                                  extra_body=GREEDY)
    msg = claude.messages.create(**kwargs)
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) == 1
    assert uses[0].name == "get_weather" and uses[0].id.startswith("toolu_") and isinstance(uses[0].input["city"], str)  # type: ignore[index]
    with claude.messages.stream(**kwargs) as stream:
        streamed = stream.get_final_message()
    s_uses = [b for b in streamed.content if b.type == "tool_use"]
    assert streamed.stop_reason == "tool_use" and [b.input for b in s_uses] == [uses[0].input]


def test_a_tool_result_turn_reads_the_previous_turn_from_the_cache(claude: anthropic.Anthropic,
                                                                  model_name: str) -> None:
    system = [{"type": "text", "text": "You answer questions about the weather. " * 20,
               "cache_control": {"type": "ephemeral"}}]
    first = claude.messages.create(model=model_name, max_tokens=48, system=system, tools=[WEATHER],  # type: ignore[arg-type]
                                   tool_choice={"type": "any"}, messages=[{"role": "user", "content": "Rome?"}])
    use = next(b for b in first.content if b.type == "tool_use")
    follow = [{"role": "user", "content": "Rome?"}, {"role": "assistant", "content": first.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"},
                                           {"type": "text", "text": "And tomorrow?"}]}]
    second = claude.messages.create(model=model_name, max_tokens=4, system=system, tools=[WEATHER],  # type: ignore[arg-type]
                                    messages=follow)
    assert second.usage.cache_read_input_tokens >= first.usage.cache_read_input_tokens + 100
    counted = claude.messages.count_tokens(model=model_name, system=system, tools=[WEATHER],  # type: ignore[arg-type]
                                           messages=follow)  # type: ignore[arg-type]
    u = second.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def _retained_pages(srv: ServerThread) -> float:
    text = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kvstrata:kv_class_pages{") and 'tier="device"' in line and 'class="retained"' in line)


def test_a_breakpoint_counts_what_it_writes_and_retains_the_prefix(claude: anthropic.Anthropic, server: ServerThread,
                                                                   model_name: str) -> None:
    system = [{"type": "text", "text": "Billing header"},
              {"type": "text", "text": f"{uuid.uuid4()} You are a careful assistant. " * 30,
               "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    question = [{"role": "user", "content": "A question that comes after the breakpoint, " * 5}]
    before = _retained_pages(server)
    first = claude.messages.create(model=model_name, max_tokens=2, system=system, messages=question)  # type: ignore[arg-type]
    u = first.usage
    assert u.cache_read_input_tokens == 0 and u.cache_creation_input_tokens > 150 and u.input_tokens > 20
    assert _retained_pages(server) - before == u.cache_creation_input_tokens // 16  # the pages before it only
    again = claude.messages.create(model=model_name, max_tokens=2, system=system, messages=question)  # type: ignore[arg-type]
    assert again.usage.cache_read_input_tokens >= u.cache_creation_input_tokens // 16 * 16
    assert again.usage.cache_creation_input_tokens < 16  # the breakpoint's partial page, never cached
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=model_name, max_tokens=2, messages=question,  # type: ignore[arg-type]
                               system=[{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2d"}}])


@pytest.mark.parametrize("change, param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]},
     "messages[0].content[0]"),
    ({"temperature": 1.5}, "temperature"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "system", "content": 5}]}, "messages[0].content"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_bad_requests_get_anthropic_400s(claude: anthropic.Anthropic, model_name: str, change: dict[str, Any],
                                         param: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:  # extra_body: the SDK does not check what it sends
        claude.messages.create(model=model_name, max_tokens=4, messages=HI, extra_body=change)  # type: ignore[arg-type]
    assert info.value.body["type"] == "error"  # type: ignore[index]
    err = info.value.body["error"]  # type: ignore[index]
    assert err["type"] == "invalid_request_error" and param.split("[")[0].split(".")[0] in err["message"]


def test_unknown_model_missing_body_and_route_are_anthropic_errors(claude: anthropic.Anthropic,
                                                                   server: ServerThread) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="claude-opus-9", max_tokens=4, messages=HI)  # type: ignore[arg-type]
    assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    for resp in (httpx.post(f"{server.base_url}/v1/messages", content=b"{", timeout=10),
                 httpx.post(f"{server.base_url}/v1/messages/nope", json={}, timeout=10)):
        assert resp.status_code in (400, 404)
        assert resp.json()["type"] == "error" and set(resp.json()["error"]) == {"type", "message"}


def test_fields_claude_code_sends_are_accepted(claude: anthropic.Anthropic, model_name: str) -> None:
    msg = claude.messages.create(  # type: ignore[call-overload]
        model=model_name, max_tokens=4, messages=HI, thinking={"type": "disabled"},
        metadata={"user_id": '{"session_id": "s-1"}'},
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "low"}},
        extra_headers={"anthropic-beta": "claude-code-20250219", "X-Claude-Code-Session-Id": "s-1"},
        tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search"}],
    )
    assert msg.type == "message"


@pytest.fixture(scope="module")
def keyed(engine: AsyncEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    keys = Path(tmp_path_factory.mktemp("keys")) / "keys.txt"
    keys.write_text("sk-alice alice\nsk-bob bob\n")
    with serve(make_state(engine, ServerConfig(port=0, api_key_file=str(keys)))) as srv:
        yield srv


def test_x_api_key_maps_to_tenants_that_share_no_pages(keyed: ServerThread, model_name: str) -> None:
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(keyed, "sk-mallory").messages.create(model=model_name, max_tokens=2, messages=HI)  # type: ignore[arg-type]
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    long = [{"role": "user", "content": "Tell me about the sea and the sky. " * 12}]
    alice, bob = _client(keyed, "sk-alice"), _client(keyed, "sk-bob")
    alice.messages.create(model=model_name, max_tokens=2, messages=long)  # type: ignore[arg-type]
    assert alice.messages.create(model=model_name, max_tokens=2, messages=long).usage.cache_read_input_tokens > 0  # type: ignore[arg-type]
    assert bob.messages.create(model=model_name, max_tokens=2, messages=long).usage.cache_read_input_tokens == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
def test_a_thinking_model_answers_with_thinking_blocks_and_thinking_off_is_content(
        thinking_engine: AsyncEngine, stream: bool) -> None:
    from thinking_model import ScriptedEngine

    model = thinking_engine.served_model_name
    scripted = ScriptedEngine(thinking_engine, ["I should ", "greet them.</th", "ink>\n\nHello!"])
    with serve(make_state(scripted)) as srv:
        claude = _client(srv)
        if stream:
            with claude.messages.stream(model=model, max_tokens=32, messages=HI,
                                        thinking={"type": "adaptive"}) as events:  # type: ignore[arg-type]
                msg = events.get_final_message()
        else:
            msg = claude.messages.create(model=model, max_tokens=32, messages=HI,  # type: ignore[arg-type]
                                         thinking={"type": "enabled", "budget_tokens": 1024})
        assert [b.type for b in msg.content] == ["thinking", "text"]
        assert msg.content[0].thinking == "I should greet them."  # type: ignore[union-attr]
        assert msg.content[0].signature and msg.content[1].text == "Hello!"  # type: ignore[union-attr]
        # sent back, the thinking renders in the history as the template writes it
        follow = [*HI, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                  {"role": "user", "content": "Again?"}]
        claude.messages.create(model=model, max_tokens=8, messages=follow,  # type: ignore[arg-type]
                               thinking={"type": "disabled"})
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert "<think>\nI should greet them.</think>\n\nHello!<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off: the empty block
