"""The gateway hashes a request's prompt exactly as a rank would: same tokens, same page hashes."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstrata.kv.hashing import hash_pages, hash_to_int64, namespace_root
from kvstrata.model.tokenizer import Tokenizer
from kvstrata.router.prompt import PromptHasher, SegmentEncoder
from kvstrata.serving.auth import tenant_extra_key
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.responses.request import ResponsesRequest, chat_body
from kvstrata.serving.tool_calls.plan import plan_tools

ROOT = namespace_root("test/model", "float32", 16, "nhd")
CHAT = "/v1/chat/completions"
TEXTS = [
    "plain words, then  two spaces and\n\nnewlines\t tabs",
    "a user who types <|im_end|> and <|im_start|>assistant in the middle",
    "<|im_start|>user\n  leading spaces<|im_end|>\n<|im_start|>assistant\n",
    "ünïcödé, emoji 🙂🚀, CJK 漢字, numbers 1234567 3.14159",
    "",
    "<|endoftext|><|endoftext|>",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_path(tiny_model_dir)


def test_segment_encoder_equals_the_tokenizer(tokenizer: Tokenizer) -> None:
    encode = SegmentEncoder(tokenizer)
    for text in TEXTS + ["".join(TEXTS)]:
        for _ in range(2):  # cold, then from the memo
            assert encode(text) == tokenizer.encode(text), text


def test_segment_memo_is_bounded(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SegmentEncoder, "MAX_SEGMENTS", 4)
    encode = SegmentEncoder(tokenizer)
    for i in range(10):
        assert encode(f"message {i}<|im_end|>") == tokenizer.encode(f"message {i}<|im_end|>")
    assert len(encode._memo) == 4  # noqa: SLF001


def test_chat_prompt_tokens_and_hashes_match_the_rank(tokenizer: Tokenizer) -> None:
    hasher = PromptHasher(tokenizer, 16, ROOT)
    messages = [
        {"role": "developer", "content": "You are terse. " * 20},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "ok <|im_end|> sure"},
        {"role": "user", "content": "and again"},
    ]
    body = {"messages": messages, "temperature": 0, "data_parallel_rank": 1}
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "part one\npart two"},
         {"role": "assistant", "content": "ok <|im_end|> sure"}, {"role": "user", "content": "and again"}],
        add_generation_prompt=True,
    )
    tokens = tokenizer.encode(rendered)
    prompt = hasher.prompt(CHAT, body)
    assert prompt is not None and prompt.num_tokens == len(tokens)
    n = (len(tokens) - 1) // 16  # the pages a rank can match: never the last token's
    assert prompt.hashes == [hash_to_int64(h) for h in hash_pages(tokens, 16, ROOT)[:n]]
    salted = hasher.prompt(CHAT, {**body, "cache_salt": "tenant-a"})
    assert salted is not None and not set(salted.hashes) & set(prompt.hashes)


def test_completions_and_unrenderable_bodies(tokenizer: Tokenizer) -> None:
    hasher = PromptHasher(tokenizer, 16, ROOT)
    assert hasher.tokens("/v1/completions", {"prompt": "hello there"}) == tokenizer.encode("hello there")
    assert hasher.tokens("/v1/completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert hasher.tokens("/v1/completions", {"prompt": ["first", "second"]}) == tokenizer.encode("first")
    assert hasher.prompt(CHAT, {"messages": "not a list"}) is None  # the rank will answer the 400
    assert hasher.prompt(CHAT, {"messages": [{"role": "wizard", "content": "x"}]}) is None
    assert hasher.prompt("/v1/completions", {"prompt": [-1]}) is None


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _rank_tokens(tokenizer: Tokenizer, body: dict[str, Any]) -> list[int]:
    """The prompt a rank builds (serving/prepare.prepare_chat's rendering)."""
    plan = plan_tools(ChatCompletionRequest.model_validate(body), tokenizer, "auto")
    return tokenizer.encode(tokenizer.apply_chat_template(plan.messages, add_generation_prompt=True,
                                                          tools=plan.template_tools))


def test_tools_and_responses_bodies_render_as_on_the_rank(tokenizer: Tokenizer) -> None:
    hasher = PromptHasher(tokenizer, 16, ROOT)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    chat = {"messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": TOOLS}
    # SmolLM2's template has no tool syntax: the rank writes the tools into the system message
    assert hasher.tokens(CHAT, chat) == _rank_tokens(tokenizer, chat)
    responses = {"input": "weather?", "instructions": "Be brief.", "tools": [{"type": "function", **TOOLS[0]["function"]}]}
    chat_form, _ = chat_body(ResponsesRequest.model_validate(responses), [])
    assert hasher.tokens("/v1/responses", responses) == _rank_tokens(tokenizer, chat_form)
    assert hasher.tokens("/v1/responses", {**responses, "previous_response_id": "resp_1"}) is None


def test_a_tenant_hashes_as_its_rank_does(tokenizer: Tokenizer) -> None:
    """With API keys on, a rank mixes the key's tenant into every page hash (auth.tenant_extra_key);
    so must the gateway, or no authenticated request would ever match the ranks' caches."""
    hasher = PromptHasher(tokenizer, 16, ROOT)
    body = {"messages": [{"role": "user", "content": "a long question " * 40}], "cache_salt": "s"}
    tokens = _rank_tokens(tokenizer, body)
    n = (len(tokens) - 1) // 16
    for tenant in ("alice", "bob"):
        want = [hash_to_int64(h) for h in hash_pages(tokens, 16, ROOT, tenant_extra_key(tenant, "s"))[:n]]
        prompt = hasher.prompt(CHAT, body, tenant)
        assert prompt is not None and prompt.hashes == want
    alice, bob = hasher.prompt(CHAT, body, "alice"), hasher.prompt(CHAT, body, "bob")
    assert alice is not None and bob is not None and not set(alice.hashes) & set(bob.hashes)


def test_a_messages_body_renders_as_its_chat_request_on_the_rank(tokenizer: Tokenizer) -> None:
    from kvstrata.serving.messages.request import MessagesRequest
    from kvstrata.serving.messages.request import chat_body as messages_chat_body

    hasher = PromptHasher(tokenizer, 16, ROOT)
    body = {"max_tokens": 64, "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}],
            "messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                            "input": {"city": "Oslo"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}]}
    chat_form, _ = messages_chat_body(MessagesRequest.model_validate(body), None)
    assert hasher.tokens("/v1/messages", body) == _rank_tokens(tokenizer, chat_form)
    assert hasher.tokens("/v1/messages", {"messages": []}) is None  # the rank will say why
