"""`POST /v1/responses` on the chat path: the request becomes a chat request (request.py), runs
through the same validation, tool planning, constrained decoding and engine, and answers as a
response object or its event stream. Stored responses (`store`, default true) let a later request
send only its new input with `previous_response_id`; the conversation is re-rendered from the
stored messages in the same spelling, so the prompt starts with the previous prompt and reply and
the prefix cache serves them (`usage.input_tokens_details.cached_tokens`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.auth import request_tenant, scoped_to_tenant
from kvstrata.serving.deadline import with_deadline
from kvstrata.serving.errors import validation_error_to_api_error
from kvstrata.serving.prepare import prepare_chat
from kvstrata.serving.protocol import ChatCompletionRequest
from kvstrata.serving.responses.output import (
    ResponseHeader, conversation_turn, new_id, output_items, responses_usage, split_reply,
)
from kvstrata.serving.responses.request import ResponsesRequest, chat_body
from kvstrata.serving.responses.store import ResponseStore
from kvstrata.serving.responses.stream import response_events
from kvstrata.serving.streaming import UsageTracker, fan_out, merge_choices, raise_if_failed

if TYPE_CHECKING:
    from kvstrata.serving.state import ServerState


def install_responses_route(app: FastAPI, state: ServerState, store: ResponseStore | None = None) -> ResponseStore:
    store = store or ResponseStore()

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request) -> Response:
        req.refuse_unsupported()
        engine = state.ready_engine()
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            found = store.get(req.previous_response_id)
            if found is None:
                raise InvalidRequestError(f"no stored response {req.previous_response_id!r} (kept: the last "
                                          f"{store.max_responses}, in memory)", "previous_response_id", "not_found")
            history = found
        body, conversation = chat_body(req, history)
        try:
            chat = ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error_to_api_error(exc.errors()) from None
        prepared = prepare_chat(chat, engine, state.server_cfg.tool_call_parser)
        prepared = scoped_to_tenant(prepared, request_tenant(request))
        response_id = new_id("resp")
        header = ResponseHeader(response_id, engine.served_model_name, req.model_dump(exclude_none=True))
        jobs = fan_out(response_id, prepared)
        usage = UsageTracker([len(p) for p in prepared.prompts], 1)
        outputs = with_deadline(merge_choices(engine, jobs), prepared.timeout_s)

        def keep(items: list[dict[str, Any]]) -> None:
            if req.store:
                store.put(response_id, conversation + [conversation_turn(items)])

        if req.stream:
            events = response_events(header, prepared.tool_format, outputs, usage, keep)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts, reason = [], None
        try:
            async for index, out in outputs:
                usage.observe(index, out)
                raise_if_failed(out)
                texts.append(out.new_text)
                reason = out.finish_reason if out.finished else reason
        finally:
            await outputs.aclose()  # type: ignore[attr-defined]
        content, calls = split_reply(prepared.tool_format, "".join(texts))
        items = output_items(content, calls)
        keep(items)
        if calls:
            reason = "tool_calls"
        return JSONResponse(header.body("completed", items, responses_usage(usage.body()), reason))

    return store
