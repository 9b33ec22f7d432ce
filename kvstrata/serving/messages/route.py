"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API on the chat path.

A Messages request becomes a chat request (request.py) and runs through the same validation, tool
planning, constrained decoding, prefix cache and engine as /v1/chat/completions; the reply is read
back into Anthropic's content blocks (output.py) or its event stream (stream.py). Errors leave in
Anthropic's shape (errors.py). The route itself knows nothing of the tiers or the tool-call
formats: those see a chat request. `--log-requests` records the chat request it became, so
`kvstrata analyze` reads a Claude Code session like any other.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from kvstrata.serving.auth import request_tenant, scoped_to_tenant
from kvstrata.serving.deadline import with_deadline
from kvstrata.serving.disconnect import CLIENT_CLOSED_REQUEST, ClientDisconnected, until_disconnect
from kvstrata.serving.errors import validation_error_to_api_error
from kvstrata.serving.messages.cache_hints import Breakpoint, breakpoint_of, session_key, with_breakpoint
from kvstrata.serving.messages.output import MessageHeader, Usage, reply_blocks, stop_reason
from kvstrata.serving.messages.request import CountTokensRequest, MessagesRequest, chat_body
from kvstrata.serving.messages.stream import message_events
from kvstrata.serving.prepare import PreparedRequest, prepare_chat
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.response_cache.key import CHAT
from kvstrata.serving.streaming import UsageTracker, fan_out, first_output, merge_choices, raise_if_failed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kvstrata.engine.async_engine import AsyncEngine
    from kvstrata.engine.outputs import RequestOutput
    from kvstrata.serving.state import ServerState

logger = logging.getLogger(__name__)


def as_chat(req: MessagesRequest, request: Request) -> tuple[dict[str, Any], ChatCompletionRequest, Breakpoint | None]:
    """(chat body, validated chat request, its last cache_control breakpoint) of a Messages request."""
    req.refuse_unsupported()
    body, ends = chat_body(req, session_key(request.headers, req.metadata))
    mark = breakpoint_of(req, ends, bool(body["messages"]) and body["messages"][0]["role"] == "system")
    try:
        return body, ChatCompletionRequest.model_validate(body), mark
    except ValidationError as exc:
        raise validation_error_to_api_error(exc.errors()) from None


async def _collect(outputs: AsyncIterator[tuple[int, RequestOutput]], usage: UsageTracker) -> tuple[str, RequestOutput]:
    """(text, last output) of the one choice."""
    texts: list[str] = []
    last = None
    async for index, out in outputs:
        usage.observe(index, out)
        raise_if_failed(out)
        texts.append(out.new_text)
        last = out
    assert last is not None
    return "".join(texts), last


async def _serve(request: Request, engine: AsyncEngine, prepared: PreparedRequest, breakpoint_tokens: int,
                 stream: bool) -> Response:
    header = MessageHeader(engine.served_model_name)
    jobs = fan_out(header.message_id, prepared)
    usage = UsageTracker([len(p) for p in prepared.prompts], 1)
    outputs = with_deadline(merge_choices(engine, jobs), prepared.timeout_s)
    reasoning, fmt = prepared.reasoning, prepared.tool_format
    try:
        if stream:
            first = await until_disconnect(request, first_output(outputs))  # errors before a token get a status
            raise_if_failed(first[1])
            events = message_events(header, reasoning, fmt, first, outputs, usage, breakpoint_tokens)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text, last = await until_disconnect(request, _collect(outputs, usage))
    except ClientDisconnected:
        logger.info("client_disconnected request_id=%s", header.message_id)
        await outputs.aclose()  # type: ignore[attr-defined]
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except BaseException:
        await outputs.aclose()  # type: ignore[attr-defined]
        raise
    blocks, called = reply_blocks(reasoning, fmt, text)
    reason = stop_reason(last.finish_reason, last.stop_string, called)
    return JSONResponse(header.body(blocks, reason, last.stop_string, Usage.of(usage, breakpoint_tokens)))


def install_messages_routes(app: FastAPI, state: ServerState) -> None:
    cfg = state.server_cfg

    def prepare(chat: ChatCompletionRequest, engine: AsyncEngine, mark: Breakpoint | None) -> tuple[PreparedRequest, int]:
        prepared = prepare_chat(chat, engine, cfg.tool_call_parser, cfg.reasoning_parser)
        return with_breakpoint(prepared, chat, mark, engine.tokenizer, cfg.tool_call_parser)

    @app.post("/v1/messages")
    async def messages(req: MessagesRequest, request: Request) -> Response:
        engine = state.ready_engine()
        body, chat, mark = as_chat(req, request)
        if state.request_log is not None:  # the chat request it runs as, which `kvstrata analyze` reads
            state.request_log.write_body(CHAT, body)
        # template, tokenizer and schema checks: CPU work, kept off the event loop
        prepared, breakpoint_tokens = await asyncio.to_thread(prepare, chat, engine, mark)
        prepared = scoped_to_tenant(prepared, request_tenant(request))
        return await _serve(request, engine, prepared, breakpoint_tokens, req.stream)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest, request: Request) -> Response:
        engine = state.ready_engine()
        _, chat, _ = as_chat(req, request)
        prepared, _ = await asyncio.to_thread(prepare, chat, engine, None)
        return JSONResponse({"input_tokens": len(prepared.prompts[0])})
