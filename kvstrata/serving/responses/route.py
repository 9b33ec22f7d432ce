"""`POST /v1/responses` on the chat path: the request becomes a chat request (request.py), runs
through the same validation, tool planning, constrained decoding and engine, and answers as a
response object or its event stream. Stored responses (`store`, default true) let a later request
send only its new input with `previous_response_id`; the conversation is re-rendered from the
stored messages in the same spelling, so the prompt starts with the previous prompt and reply and
the prefix cache serves them (`usage.input_tokens_details.cached_tokens`). A client that stores
nothing here (`store: false`, as Codex) sends the whole history instead, its reasoning items included
(reasoning_items.py), and gets the same prompt.

Stored responses belong to the API key's tenant (store.py): another tenant's id is "not found",
word for word. Every answer carries `RESPONSE_ID_HEADER`, which the DP gateway reads to send a
later `previous_response_id` to the rank that stored it. A non-streamed request whose client
leaves is aborted (disconnect.py), as on the chat routes."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.model.logprobs import TokenLogprob
from kvstrata.serving.auth import request_tenant, scoped_to_tenant
from kvstrata.serving.deadline import with_deadline
from kvstrata.serving.disconnect import CLIENT_CLOSED_REQUEST, ClientDisconnected, until_disconnect
from kvstrata.serving.errors import quote, validation_error_to_api_error
from kvstrata.serving.logprob_shapes import chat_logprobs
from kvstrata.serving.prepare import prepare_chat
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.response_cache.key import CHAT
from kvstrata.serving.reasoning import ReasoningSplitter, split_reasoning
from kvstrata.serving.responses.output import (
    OutputPlan, ResponseHeader, conversation_turn, new_id, output_items, responses_usage, split_reply,
)
from kvstrata.serving.responses.request import ResponsesRequest, chat_body
from kvstrata.serving.responses.store import ResponseStore
from kvstrata.serving.responses.stream import response_events
from kvstrata.serving.responses.tools import request_tools
from kvstrata.serving.streaming import UsageTracker, fan_out, merge_choices, raise_if_failed
from kvstrata.serving.tool_calls.output import finish_reason

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kvstrata.serving.state import ServerState

RESPONSE_ID_HEADER = "x-kvstrata-response-id"


async def _collect(
    outputs: AsyncIterator[tuple[int, RequestOutput]], usage: UsageTracker, reasoning: str | None,
) -> tuple[str, str | None, int, list[TokenLogprob]]:
    """(text, finish reason, reasoning tokens: counted as stream.py counts them, the logprobs of the message's
    tokens: each output's that is not reasoning, as stream.py attributes them) of the one choice."""
    texts: list[str] = []
    reason: str | None = None
    spent = 0
    scored: list[TokenLogprob] = []
    splitter = ReasoningSplitter(reasoning) if reasoning is not None else None
    try:
        async for index, out in outputs:
            usage.observe(index, out)
            raise_if_failed(out)
            texts.append(out.new_text)
            reason = out.finish_reason if out.finished else reason
            if splitter is not None and (splitter.feed(out.new_text, out.finished)[0] or splitter.thinking):
                spent += len(out.new_token_ids)
            else:
                scored.extend(out.new_logprobs or ())
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
    return "".join(texts), reason, spent, scored


def install_responses_route(app: FastAPI, state: ServerState, store: ResponseStore | None = None) -> ResponseStore:
    store = store or ResponseStore()

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request) -> Response:
        req.refuse_unsupported()
        engine = state.ready_engine()
        tenant = request_tenant(request)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            found = store.get(tenant, req.previous_response_id)
            if found is None:  # the same words for an id of another tenant: no oracle
                raise InvalidRequestError(f"no stored response {quote(req.previous_response_id)} (kept: the last "
                                          f"{store.max_responses}, in memory)", "previous_response_id", "not_found")
            history = found
        body, conversation = chat_body(req, history)
        if state.request_log is not None:  # the chat request it runs as, which `kvstrata analyze` reads
            state.request_log.write_body(CHAT, body)
        try:
            chat = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error_to_api_error(exc.errors()) from None
        tools = request_tools(req.tools, req.input)
        cfg = state.server_cfg
        try:  # template, tokenizer and schema checks: CPU work, kept off the event loop
            prepared = await asyncio.to_thread(prepare_chat, chat, engine, cfg.tool_call_parser, cfg.reasoning_parser)
        except InvalidRequestError as exc:  # a bad tool named where the client wrote it
            raise tools.client_error(exc) from None
        prepared = scoped_to_tenant(prepared, tenant)
        token_text = engine.tokenizer.token_text if req.logprobs else None
        plan = OutputPlan(prepared.tool_format, prepared.reasoning, tools, req.encrypted_reasoning, token_text)
        response_id = new_id("resp")
        header = ResponseHeader(response_id, engine.served_model_name, req.model_dump(exclude_none=True))
        jobs = fan_out(response_id, prepared)
        usage = UsageTracker([len(p) for p in prepared.prompts], 1)
        outputs = with_deadline(merge_choices(engine, jobs), prepared.timeout_s)
        headers = {RESPONSE_ID_HEADER: response_id}

        def keep(items: list[dict[str, Any]]) -> None:
            if req.store:
                store.put(tenant, response_id, conversation + [conversation_turn(items)])

        if req.stream:
            events = response_events(header, plan, outputs, usage, keep)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", **headers})
        try:
            text, reason, spent, scored = await until_disconnect(request, _collect(outputs, usage, prepared.reasoning))
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        reasoning, text = split_reasoning(prepared.reasoning, text)
        content, calls, complete = split_reply(prepared.tool_format, text)
        logprobs = chat_logprobs(scored, token_text)["content"] if token_text is not None else None
        items = output_items(plan, reasoning, content, calls, logprobs)
        keep(items)
        reason = finish_reason(complete, reason)
        return JSONResponse(header.body("completed", items, responses_usage(usage.body(), spent), reason),
                            headers=headers)

    return store
