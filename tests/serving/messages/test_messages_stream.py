"""messages/stream.py: Anthropic's event order, and a reply streamed in any pieces reads as it does whole."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import pytest

from kvstrata.engine.outputs import RequestOutput
from kvstrata.serving.messages.output import MessageHeader, reply_blocks
from kvstrata.serving.messages.stream import message_events
from kvstrata.serving.streaming import UsageTracker
from kvstrata.serving.tool_calls.formats import FORMATS

REPLY = '<think>\nRain or sun?\n</think>\n\nLet me look.\n<tool_call>\n{"name": "get_weather", ' \
        '"arguments": {"city": "Oslo"}}\n</tool_call>'


async def _outputs(pieces: list[str], reason: str, stop: str | None) -> AsyncIterator[tuple[int, RequestOutput]]:
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        yield 0, RequestOutput("r", [k], piece, finished=last, finish_reason=reason if last else None,
                               prompt_tokens=40, cached_tokens=16, output_tokens=k + 1, stop_string=stop if last else None)


def _events(pieces: list[str], reasoning: str | None, tools: bool, reason: str = "stop",
            stop: str | None = None) -> list[dict[str, Any]]:
    async def run() -> list[str]:
        outputs = _outputs(pieces, reason, stop)
        first = await outputs.__anext__()
        events = message_events(MessageHeader("m"), reasoning, FORMATS["hermes"] if tools else None, first, outputs,
                                UsageTracker([40], 1), breakpoint_tokens=32)
        return [e async for e in events]

    out = []
    for raw in asyncio.run(run()):
        kind, data = raw.split("\n")[:2]
        body = json.loads(data[len("data: "):])
        assert kind == f"event: {body['type']}"
        out.append(body)
    return out


def _blocks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks the events build, as the SDK accumulates them."""
    blocks: list[dict[str, Any]] = []
    for e in events:
        if e["type"] == "content_block_start":
            assert e["index"] == len(blocks)
            blocks.append({**e["content_block"], "_json": ""})
        elif e["type"] == "content_block_delta":
            b, d = blocks[e["index"]], e["delta"]
            key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature",
                   "input_json_delta": "_json"}[d["type"]]
            b[key] = (b[key] if key != "signature" else "") + d[key if key != "_json" else "partial_json"]
    for b in blocks:
        raw = b.pop("_json")
        if b["type"] == "tool_use":
            b["input"] = json.loads(raw)
            b.pop("id")
    return blocks


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_any_chunking_streams_the_whole_replys_blocks(size: int) -> None:
    pieces = [REPLY[i:i + size] for i in range(0, len(REPLY), size)]
    events = _events(pieces, "qwen3", tools=True)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"] and kinds.count("ping") == 1
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    whole, _ = reply_blocks("qwen3", FORMATS["hermes"], REPLY)
    for b in whole:
        b.pop("id", None)
    assert _blocks(events) == whole
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 8, "cache_creation_input_tokens": 16, "cache_read_input_tokens": 16,
                              "output_tokens": len(pieces)}
    assert events[0]["message"]["usage"]["cache_read_input_tokens"] == 16


def test_a_stop_sequence_and_an_empty_reply() -> None:
    events = _events(["Hello", " there"], None, tools=False, stop="###")
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}
    assert _blocks(events) == [{"type": "text", "text": "Hello there"}]
    events = _events([""], None, tools=False, reason="length")
    assert [e["type"] for e in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"


def test_an_engine_error_after_the_start_is_an_error_event() -> None:
    events = _events(["Hel", "lo"], None, tools=False, reason="error")
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": events[-1]["error"]["message"]}}
    assert "generation failed" in events[-1]["error"]["message"]
