"""The SSE events of a streamed /v1/responses answer (see output.py for the event names)."""
from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from kvstrata.engine.outputs import RequestOutput
from kvstrata.serving.errors import api_error_from
from kvstrata.serving.streaming import UsageTracker, raise_if_failed, sse
from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.output import ToolCallStream
from kvstrata.serving.responses.output import (
    ResponseHeader, call_item, message_item, new_id, responses_usage,
)


class _Events:
    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\n" + sse(event)


async def response_events(
    header: ResponseHeader, fmt: ToolCallFormat | None, outputs: AsyncIterator[tuple[int, RequestOutput]],
    usage: UsageTracker, on_done: Callable[[list[dict[str, Any]]], None],
) -> AsyncIterator[str]:
    """Events for one choice's outputs; `on_done(items)` runs once the response is complete. An error
    after the 200 went out is an `error` event (OpenAI clients raise it)."""
    ev = _Events()
    try:
        async for event in _events(ev, header, fmt, outputs, usage, on_done):
            yield event
    except Exception as exc:  # noqa: BLE001 - reported in-band
        err = api_error_from(exc)
        yield ev("error", code=err.code, message=err.message, param=err.param)
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


async def _events(
    ev: _Events, header: ResponseHeader, fmt: ToolCallFormat | None,
    outputs: AsyncIterator[tuple[int, RequestOutput]], usage: UsageTracker,
    on_done: Callable[[list[dict[str, Any]]], None],
) -> AsyncIterator[str]:
    items: list[dict[str, Any]] = []  # in output order; text/arguments filled as they stream
    message: dict[str, Any] | None = None
    calls: dict[int, dict[str, Any]] = {}
    tools = ToolCallStream(fmt) if fmt is not None else None
    yield ev("response.created", response=header.body("in_progress", [], None))
    yield ev("response.in_progress", response=header.body("in_progress", [], None))
    reason = None
    async for index, out in outputs:
        usage.observe(index, out)
        raise_if_failed(out)
        text, deltas = (tools.feed(out.new_text, out.finished) if tools is not None else (out.new_text, []))
        if text and (message is not None or text.strip()):
            if message is None:
                message = {"item": message_item(new_id("msg"), "", "in_progress"), "text": "", "at": len(items)}
                items.append(message)
                yield ev("response.output_item.added", output_index=message["at"], item=message["item"])
                yield ev("response.content_part.added", item_id=message["item"]["id"], output_index=message["at"],
                         content_index=0, part={"type": "output_text", "text": "", "annotations": []})
            message["text"] += text
            yield ev("response.output_text.delta", item_id=message["item"]["id"], output_index=message["at"],
                     content_index=0, delta=text, logprobs=[])
        for d in deltas:
            if "id" in d:
                fn = d["function"]
                call = {"item": call_item(new_id("fc"), d["id"], fn["name"], "", "in_progress"), "args": "",
                        "at": len(items)}
                calls[d["index"]] = call
                items.append(call)
                yield ev("response.output_item.added", output_index=call["at"], item=call["item"])
                continue
            call = calls[d["index"]]
            call["args"] += d["function"]["arguments"]
            yield ev("response.function_call_arguments.delta", item_id=call["item"]["id"], output_index=call["at"],
                     delta=d["function"]["arguments"])
        if out.finished:
            reason = tools.finish_reason(out.finish_reason) if tools is not None else out.finish_reason
    final: list[dict[str, Any]] = []
    for entry in items:
        at, item = entry["at"], entry["item"]
        if item["type"] == "message":
            done = message_item(item["id"], entry["text"])
            yield ev("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                     text=entry["text"], logprobs=[])
            yield ev("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                     part=done["content"][0])
        else:
            done = call_item(item["id"], item["call_id"], item["name"], entry["args"])
            yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                     name=item["name"], arguments=entry["args"])
        yield ev("response.output_item.done", output_index=at, item=done)
        final.append(done)
    on_done(final)
    body = header.body("completed", final, responses_usage(usage.body()), reason)
    yield ev("response.completed" if body["status"] == "completed" else "response.incomplete", response=body)
