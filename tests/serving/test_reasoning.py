"""serving/reasoning.py: which parser a template gets, and the split of a reply, whole and streamed in
any chunking (a partial `<think>` / `</think>` split across pieces is held back, never leaked); then
over HTTP on /v1/chat/completions: reasoning_content whole and streamed, tool calls read from the
content after it, thinking turned off, reasoning sent back rendered, and response-cache hits."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.reasoning import REASONING_PARSERS, ReasoningSplitter, resolve_reasoning_parser, split_reasoning
from kvstrata.serving.server import ServerThread
from serving_support import USER, assert_error, make_state, openai_client, serve
from thinking_model import ScriptedEngine

QWEN3_GENERATION = (  # Qwen3's generation prompt: <think> only as the empty block of thinking turned off
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
R1_GENERATION = (  # DeepSeek-R1's: the generation prompt opens the reasoning itself
    "{% for m in messages %}<｜{{ m.role }}｜>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}"
)


@pytest.mark.parametrize("flag, source, expected", [
    ("auto", None, None),
    ("auto", "{{ messages }}", None),
    ("auto", QWEN3_GENERATION, "qwen3"),
    ("auto", R1_GENERATION, "deepseek_r1"),
    ("auto", "{{ raise_exception('needs a system message') }}<think>\\n", "deepseek_r1"),  # read from the source
    ("none", R1_GENERATION, None),
    ("qwen3", None, "qwen3"),
    ("deepseek_r1", QWEN3_GENERATION, "deepseek_r1"),
])
def test_resolve(flag: str, source: str | None, expected: str | None) -> None:
    assert flag in REASONING_PARSERS
    assert resolve_reasoning_parser(flag, source) == expected


@pytest.mark.parametrize("kind, text, reasoning, content", [
    ("qwen3", "<think>\nplan\n</think>\n\nHello", "\nplan\n", "Hello"),
    ("qwen3", "  \n<think>a</think>b", "a", "b"),
    ("qwen3", "Hello <think>not reasoning</think>", None, "Hello <think>not reasoning</think>"),
    ("qwen3", "<thi", None, "<thi"),  # ended inside what could have opened the tag: content
    ("qwen3", "<think>cut by max_tokens", "cut by max_tokens", ""),
    ("qwen3", "<think>a</thi", "a</thi", ""),
    ("qwen3", "", None, ""),
    ("deepseek_r1", "plan</think>\n\nHi\n", "plan", "Hi\n"),
    ("deepseek_r1", "<think>plan</think>Hi", "plan", "Hi"),
    ("deepseek_r1", "no end", "no end", ""),
    ("deepseek_r1", "</think>\n", None, ""),
    ("deepseek_r1", "a</think>b</think>c", "a", "b</think>c"),
])
def test_split_whole(kind: str, text: str, reasoning: str | None, content: str) -> None:
    assert split_reasoning(kind, text) == (reasoning, content)


def test_no_parser_is_all_content() -> None:
    assert split_reasoning(None, "<think>x</think>y") == (None, "<think>x</think>y")


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        ReasoningSplitter("auto")


def test_partial_tags_are_held_back() -> None:
    s = ReasoningSplitter("qwen3")
    assert s.feed(" <th", False) == ("", "")
    assert s.feed("ink>ab</th", False) == ("ab", "")
    assert s.feed("ink>\n", False) == ("", "")
    assert s.feed("\nok", False) == ("", "ok")
    assert s.feed("", True) == ("", "")


PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", "\n", " ", "a", "b", "<thi", "nk>", "/th"])


@given(st.sampled_from(["qwen3", "deepseek_r1"]), st.lists(PIECES, max_size=12), st.data())
def test_any_chunking_equals_the_whole(kind: str, pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    splitter = ReasoningSplitter(kind)
    fed = [splitter.feed(c, final=False) for c in chunks] + [splitter.feed("", final=True)]
    reasoning = "".join(r for r, _ in fed)
    assert (reasoning or None, "".join(c for _, c in fed)) == split_reasoning(kind, text)


# --- over HTTP: /v1/chat/completions with a thinking template (thinking_model.py) ---------------------------

TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _chat(srv: ServerThread, model: str, stream: bool, **body: Any) -> tuple[str | None, str, list[Any], Any]:
    """(reasoning_content, content, tool calls, finish_reason), read as a client would."""
    client = openai_client(srv)
    messages: Any = body.pop("messages", USER)
    if not stream:
        choice = client.chat.completions.create(model=model, messages=messages, **body).choices[0]
        msg = choice.message
        reasoning = getattr(msg, "reasoning_content", "absent")
        return reasoning, msg.content or "", msg.tool_calls or [], choice.finish_reason
    reasoning, content, calls, reason = [], [], [], None
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True, **body):
        delta = chunk.choices[0].delta
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        content.append(delta.content or "")
        calls += delta.tool_calls or []
        reason = chunk.choices[0].finish_reason or reason
    return "".join(reasoning) or None, "".join(content), calls, reason


@pytest.mark.parametrize("stream", [False, True])
def test_chat_splits_reasoning_then_reads_calls_from_the_content(
    thinking_engine: AsyncEngine, stream: bool,
) -> None:
    model = thinking_engine.served_model_name
    script = ["  <thi", "nk>\nplan\n</th", "ink>\n\nHel", "lo"]
    qwen3 = ServerConfig(port=0, reasoning_parser="qwen3")
    with serve(make_state(ScriptedEngine(thinking_engine, script), qwen3)) as srv:
        assert _chat(srv, model, stream)[:2] == ("\nplan\n", "Hello")
    with serve(make_state(ScriptedEngine(thinking_engine, ["call it</think>\n\n", CALL]))) as srv:  # auto: deepseek_r1
        reasoning, content, calls, reason = _chat(srv, model, stream, tools=TOOLS)
        assert (reasoning, content.strip(), reason) == ("call it", "", "tool_calls")
        assert calls[0].function.name == "get_weather"


@pytest.mark.parametrize("body", [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}])
def test_thinking_off_renders_the_empty_block_and_the_reply_is_content(thinking_engine: AsyncEngine,
                                                                      body: dict[str, Any]) -> None:
    scripted = ScriptedEngine(thinking_engine, ["plan</think>answer"])
    with serve(make_state(scripted)) as srv:
        reasoning, content, _, _ = _chat(srv, thinking_engine.served_model_name, False, extra_body=body)
    assert (reasoning, content) == ("absent", "plan</think>answer")
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_sent_back_is_rendered(thinking_engine: AsyncEngine) -> None:
    scripted = ScriptedEngine(thinking_engine, ["ok"])
    history = [*USER, {"role": "assistant", "content": "Hi!", "reasoning_content": "greet them"},
               {"role": "user", "content": "again"}]
    with serve(make_state(scripted)) as srv:
        _chat(srv, thinking_engine.served_model_name, False, messages=history)
    prompt = thinking_engine.tokenizer.decode(scripted.prompts[-1], skip_special_tokens=False)
    assert "<|im_start|>assistant\n<think>\ngreet them</think>\n\nHi!<|im_end|>" in prompt


def test_bad_reasoning_fields_get_a_400_naming_them(thinking_engine: AsyncEngine) -> None:
    with serve(make_state(thinking_engine)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for body, param in [({"reasoning_effort": "max"}, "reasoning_effort"),
                            ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
                            ({"chat_template_kwargs": []}, "chat_template_kwargs")]:
            assert_error(http.post("/v1/chat/completions", json={"messages": USER, **body}), 400, param)


def test_a_cache_hit_splits_reasoning_as_the_miss_did(thinking_engine: AsyncEngine) -> None:
    scripted = ScriptedEngine(thinking_engine, ["step one", "</think>\n\nDone"])
    cfg = ServerConfig(port=0, response_cache_size=4)
    with serve(make_state(scripted, cfg)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:
        body = {"messages": USER, "temperature": 0}
        first, again = (http.post("/v1/chat/completions", json=body) for _ in range(2))
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
        other = http.post("/v1/chat/completions", json={**body, "reasoning_effort": "none"})
    assert [r.headers["x-kvstrata-cache"] for r in (first, again, streamed, other)] == ["miss", "hit", "hit", "miss"]
    for r in (first, again):
        assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "Done",
                                                     "reasoning_content": "step one"}
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "step one"
    assert "".join(d.get("content") or "" for d in deltas) == "Done"
    assert other.json()["choices"][0]["message"] == {"role": "assistant", "content": "step one</think>\n\nDone"}
