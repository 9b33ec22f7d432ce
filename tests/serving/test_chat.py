"""POST /v1/chat/completions against the real engine, through the openai client."""
from __future__ import annotations

from typing import Any

import openai

from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.tool_calls.render import TOOLS_HEADER
from serving_support import USER, RecordingEngine, make_state, openai_client, serve

GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


def rendered_len(engine: AsyncEngine, messages: list[dict[str, Any]]) -> int:
    return len(engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)))


def test_chat_completion_shape_and_usage(client: openai.OpenAI, engine: AsyncEngine, model_name: str) -> None:
    out = client.chat.completions.create(model=model_name, messages=USER, **GREEDY)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion" and out.model == model_name
    [choice] = out.choices
    assert choice.index == 0 and choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    usage = out.usage
    assert usage is not None
    assert usage.prompt_tokens == rendered_len(engine, USER)
    assert usage.completion_tokens == 8 and usage.total_tokens == usage.prompt_tokens + 8
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens is not None


def test_greedy_and_seeded_sampling_are_reproducible(client: openai.OpenAI, model_name: str) -> None:
    def text(**kw: Any) -> str:
        out = client.chat.completions.create(model=model_name, messages=USER, max_tokens=12, **kw)
        return out.choices[0].message.content or ""

    assert text(temperature=0) == text(temperature=0)
    assert text(seed=7, temperature=1.0) == text(seed=7, temperature=1.0)


def test_n_choices_use_seed_plus_index(client: openai.OpenAI, model_name: str) -> None:
    kw: dict[str, Any] = {"model": model_name, "messages": USER, "max_tokens": 6, "temperature": 1.0,
                          "extra_body": {"ignore_eos": True}}
    both = client.chat.completions.create(n=2, seed=100, **kw)
    assert [c.index for c in both.choices] == [0, 1]
    second = client.chat.completions.create(n=1, seed=101, **kw)
    assert both.choices[1].message.content == second.choices[0].message.content
    assert both.usage is not None and both.usage.completion_tokens == 12


def test_max_completion_tokens_wins(client: openai.OpenAI, model_name: str) -> None:
    out = client.chat.completions.create(
        model=model_name, messages=USER, max_tokens=9, max_completion_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 3


def test_stop_string_cuts_text(client: openai.OpenAI, model_name: str) -> None:
    def run(**kw: Any) -> tuple[str, str]:
        out = client.completions.create(
            model=model_name, prompt="The capital of France is", max_tokens=24, temperature=0, **kw
        )
        return out.choices[0].text, out.choices[0].finish_reason

    full, reason = run(extra_body={"ignore_eos": True})
    assert reason == "length"
    stop = full[len(full) // 2 :][:3]
    cut, reason = run(stop=[stop], extra_body={"ignore_eos": True})
    assert (cut, reason) == (full[: full.index(stop)], "stop")


def test_prompt_that_nearly_fills_the_context_gets_max_tokens_clamped(
    client: openai.OpenAI, engine: AsyncEngine, model_name: str
) -> None:
    ids = list(range(1000, 1000 + engine.max_model_len - 5))
    out = client.completions.create(model=model_name, prompt=ids, max_tokens=100, extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == 5
    assert out.choices[0].finish_reason == "length"


def test_repeated_prompt_reports_cached_tokens_per_cache_salt(client: openai.OpenAI, model_name: str) -> None:
    messages = [{"role": "user", "content": "tell me about caching " * 20}]

    def cached(salt: str) -> int:
        out = client.chat.completions.create(
            model=model_name, messages=messages, max_tokens=1, extra_body={"cache_salt": salt}
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        return out.usage.prompt_tokens_details.cached_tokens or 0

    assert cached("tenant-a") == 0
    assert cached("tenant-a") >= 64
    assert cached("tenant-b") == 0


def test_message_forms_render_through_the_template(engine: AsyncEngine, model_name: str) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    conversation: list[dict[str, Any]] = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is"}, {"type": "text", "text": "2+2?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    spy = _TemplateSpy(engine)
    with serve(make_state(spy)) as srv:
        out = openai_client(srv).chat.completions.create(model=model_name, messages=conversation, max_tokens=1)
    expected = [  # what the template is given: SmolLM2's template has no tool syntax: the call as text, the result with its id
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is\n2+2?"},
        {"role": "assistant", "content": '{"name": "add", "arguments": {}}'},  # no tool syntax: the call as text
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
    ]
    assert [c["messages"] for c in spy.calls] == [expected]
    assert out.usage is not None and out.usage.prompt_tokens == rendered_len(engine, expected)


class _TemplateSpy(RecordingEngine):
    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.calls: list[dict[str, Any]] = []
        spy = self

        class Tok:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner.tokenizer, name)

            def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True, tools: Any = None) -> str:
                spy.calls.append({"messages": messages, "tools": tools})
                return inner.tokenizer.apply_chat_template(messages, add_generation_prompt, tools=tools)

        self.tokenizer = Tok()


def test_tools_reach_the_chat_template(engine: AsyncEngine, model_name: str) -> None:
    spy = _TemplateSpy(engine)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    with serve(make_state(spy)) as srv:
        client = openai_client(srv)
        client.chat.completions.create(model=model_name, messages=USER, max_tokens=1, tools=tools)
        client.chat.completions.create(
            model=model_name, messages=USER, max_tokens=1, tools=tools, tool_choice="none"
        )
    # SmolLM2's template has no tool syntax: the tools are written into a system message instead
    assert [c["tools"] for c in spy.calls] == [None, None]
    first, second = (c["messages"] for c in spy.calls)
    assert first[0]["role"] == "system" and TOOLS_HEADER in first[0]["content"] and '"add"' in first[0]["content"]
    assert second == [{"role": "user", "content": "hi"}]
