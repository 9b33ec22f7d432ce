"""The SSE events of a streamed /v1/responses answer (see output.py for the event names).

Items open as their first text arrives (output_item.added) and close (their ...done events and
output_item.done) at the end, in output order; the reasoning item closes as soon as the reply leaves
it, so its done events come before the message or calls open, as OpenAI streams them.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from kvstrata.engine.outputs import RequestOutput
from kvstrata.model.logprobs import TokenLogprob
from kvstrata.serving.errors import api_error_from
from kvstrata.serving.logprob_shapes import chat_logprobs
from kvstrata.serving.reasoning import ReasoningSplitter
from kvstrata.serving.responses.output import (
    OutputPlan, ResponseHeader, call_item, message_item, new_id, responses_usage,
)
from kvstrata.serving.responses.reasoning_items import reasoning_item
from kvstrata.serving.streaming import UsageTracker, raise_if_failed, sse
from kvstrata.serving.tool_calls.output import ToolCallStream


class _Events:
    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\n" + sse(event)


async def response_events(
    header: ResponseHeader, plan: OutputPlan, outputs: AsyncIterator[tuple[int, RequestOutput]],
    usage: UsageTracker, on_done: Callable[[list[dict[str, Any]]], None],
) -> AsyncIterator[str]:
    """Events for one choice's outputs; `on_done(items)` runs once the response is complete. An error
    after the 200 went out is an `error` event (OpenAI clients raise it)."""
    ev = _Events()
    try:
        async for event in _events(ev, header, plan, outputs, usage, on_done):
            yield event
    except Exception as exc:  # noqa: BLE001 - reported in-band
        err = api_error_from(exc)
        yield ev("error", code=err.code, message=err.message, param=err.param)
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


def _close(ev: _Events, entry: dict[str, Any], plan: OutputPlan) -> list[str]:
    """The events that finish one item; its final form is kept in entry["done"]."""
    at, item = entry["at"], entry["item"]
    out: list[str] = []
    if item["type"] == "reasoning":
        done = reasoning_item(item["id"], entry["text"], plan.encrypted)
        out.append(ev("response.reasoning_text.done", item_id=item["id"], output_index=at, content_index=0,
                      text=entry["text"]))
    elif item["type"] == "message":
        done = message_item(item["id"], entry["text"], logprobs=entry.get("logprobs"))
        out.append(ev("response.output_text.done", item_id=item["id"], output_index=at, content_index=0,
                      text=entry["text"], logprobs=entry.get("logprobs", [])))
        out.append(ev("response.content_part.done", item_id=item["id"], output_index=at, content_index=0,
                      part=done["content"][0]))
    else:
        done = call_item(item["id"], item["call_id"], (item.get("namespace"), item["name"]), entry["text"])
        out.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                      name=item["name"], arguments=entry["text"]))
    entry["done"] = done
    return out + [ev("response.output_item.done", output_index=at, item=done)]


async def _events(
    ev: _Events, header: ResponseHeader, plan: OutputPlan, outputs: AsyncIterator[tuple[int, RequestOutput]],
    usage: UsageTracker, on_done: Callable[[list[dict[str, Any]]], None],
) -> AsyncIterator[str]:
    entries: list[dict[str, Any]] = []  # in output order: {"item", "at", "text"}; text/arguments as they stream
    thought: dict[str, Any] | None = None
    message: dict[str, Any] | None = None
    calls: dict[int, dict[str, Any]] = {}
    splitter = ReasoningSplitter(plan.reasoning) if plan.reasoning is not None else None
    tools = ToolCallStream(plan.tool_format) if plan.tool_format is not None else None

    def start(item: dict[str, Any]) -> dict[str, Any]:
        entries.append({"item": item, "at": len(entries), "text": ""})
        return entries[-1]

    yield ev("response.created", response=header.body("in_progress", [], None))
    yield ev("response.in_progress", response=header.body("in_progress", [], None))
    reason, reasoning_tokens = None, 0
    pending: list[TokenLogprob] = []
    async for index, out in outputs:
        usage.observe(index, out)
        raise_if_failed(out)
        thinking, text = splitter.feed(out.new_text, out.finished) if splitter is not None else ("", out.new_text)
        if thinking or (splitter is not None and splitter.thinking):
            reasoning_tokens += len(out.new_token_ids)
        else:  # the message's tokens: their logprobs go with the next text delta (a token may hold no text yet)
            pending.extend(out.new_logprobs or ())
        if thinking:
            if thought is None:
                thought = start(reasoning_item(new_id("rs"), "", plan.encrypted, "in_progress"))
                yield ev("response.output_item.added", output_index=thought["at"], item=thought["item"])
            thought["text"] += thinking
            yield ev("response.reasoning_text.delta", item_id=thought["item"]["id"], output_index=thought["at"],
                     content_index=0, delta=thinking)
        text, deltas = tools.feed(text, out.finished) if tools is not None else (text, [])
        opens = bool(deltas) or bool(text and (message is not None or text.strip()))
        if opens and thought is not None and "done" not in thought:
            for event in _close(ev, thought, plan):
                yield event
        if text and (message is not None or text.strip()):
            if message is None:
                message = start(message_item(new_id("msg"), "", "in_progress"))
                yield ev("response.output_item.added", output_index=message["at"], item=message["item"])
                yield ev("response.content_part.added", item_id=message["item"]["id"], output_index=message["at"],
                         content_index=0, part={"type": "output_text", "text": "", "annotations": []})
            message["text"] += text
            scored = chat_logprobs(pending, plan.token_text)["content"] if plan.token_text else []
            message.setdefault("logprobs", []).extend(scored)
            pending.clear()
            yield ev("response.output_text.delta", item_id=message["item"]["id"], output_index=message["at"],
                     content_index=0, delta=text, logprobs=scored)
        for d in deltas:
            if "id" in d:
                name = plan.tools.output_name(d["function"]["name"])
                calls[d["index"]] = start(call_item(new_id("fc"), d["id"], name, "", "in_progress"))
                yield ev("response.output_item.added", output_index=calls[d["index"]]["at"],
                         item=calls[d["index"]]["item"])
                continue
            call = calls[d["index"]]
            call["text"] += d["function"]["arguments"]
            yield ev("response.function_call_arguments.delta", item_id=call["item"]["id"], output_index=call["at"],
                     delta=d["function"]["arguments"])
        if out.finished:
            reason = tools.finish_reason(out.finish_reason) if tools is not None else out.finish_reason
    if message is not None and pending and plan.token_text is not None:  # tokens after the last text (the EOS)
        message.setdefault("logprobs", []).extend(chat_logprobs(pending, plan.token_text)["content"])
    for entry in entries:
        if "done" not in entry:
            for event in _close(ev, entry, plan):
                yield event
    final = [entry["done"] for entry in entries]
    on_done(final)
    body = header.body("completed", final, responses_usage(usage.body(), reasoning_tokens), reason)
    yield ev("response.completed" if body["status"] == "completed" else "response.incomplete", response=body)
