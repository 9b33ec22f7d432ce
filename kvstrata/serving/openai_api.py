"""The OpenAI-compatible FastAPI app: /v1/chat/completions, /v1/completions, /v1/models, /health
(and /v1/responses, and Anthropic's /v1/messages, as adapters onto the chat path; vLLM's /tokenize).

A route validates (protocol.py), asks the response cache (response_cache/service.py: a hit is
replayed without the engine), fans the choices into the engine and merges them (streaming.py),
then answers with one JSON body or an SSE stream, each with the `x-kvstrata-cache` header. A
client that disconnects aborts its engine requests: non-streaming routes poll
`request.is_disconnected()`; a stream's generator is closed.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvstrata.engine.outputs import RequestOutput
from kvstrata.model.logprobs import TokenLogprob
from kvstrata.serving.admin import install_admin_routes
from kvstrata.serving.auth import AuthMiddleware, request_tenant, scoped_to_tenant
from kvstrata.serving.deadline import with_deadline
from kvstrata.serving.disconnect import CLIENT_CLOSED_REQUEST, ClientDisconnected, until_disconnect
from kvstrata.serving.errors import install_error_handlers
from kvstrata.serving.health import install_health_route
from kvstrata.serving.limits import RequestLimitsMiddleware
from kvstrata.serving.logprob_shapes import CompletionOffsets
from kvstrata.serving.messages.errors import AnthropicErrors
from kvstrata.serving.messages.route import install_messages_routes
from kvstrata.serving.prepare import PreparedRequest, check_model, prepare_chat, prepare_completion, reply_reasoning
from kvstrata.serving.protocol import ChatCompletionRequest, CompletionRequest
from kvstrata.serving.rank_info import install_rank_info_route
from kvstrata.serving.response_cache.key import CHAT, COMPLETIONS
from kvstrata.serving.response_cache.replay import replay
from kvstrata.serving.response_cache.header import CacheHeaderOnErrors
from kvstrata.serving.response_cache.service import Ticket
from kvstrata.serving.responses.route import install_responses_route
from kvstrata.serving.shutdown import LifecycleMiddleware
from kvstrata.serving.state import ServerState
from kvstrata.serving.tokenize_api import install_tokenize_routes
from kvstrata.serving.worker_info import install_worker_info_routes
from kvstrata.serving.streaming import (
    ResponseShape,
    UsageTracker,
    fan_out,
    first_output,
    merge_choices,
    raise_if_failed,
    sse_events,
)
from kvstrata.serving.tool_calls.plan import reply_format

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)


async def _collect(
    outputs: AsyncIterator[tuple[int, RequestOutput]], usage: UsageTracker, shape: ResponseShape, num_choices: int
) -> list[dict[str, Any]]:
    """All choices, whole, in choice order."""
    texts: list[list[str]] = [[] for _ in range(num_choices)]
    reasons: list[str | None] = [None] * num_choices
    entries: list[list[TokenLogprob]] = [[] for _ in range(num_choices)]
    prompts: list[list[TokenLogprob | None] | None] = [None] * num_choices
    async for index, out in outputs:
        usage.observe(index, out)
        raise_if_failed(out)
        texts[index].append(out.new_text)
        entries[index].extend(out.new_logprobs or ())
        if out.prompt_logprobs is not None:
            prompts[index] = out.prompt_logprobs
        if out.finished:
            reasons[index] = out.finish_reason
    choices = []
    for i in range(num_choices):
        text, offsets = "".join(texts[i]), CompletionOffsets()
        if shape.echo is not None:
            prompt, logprobs = shape.echoed(i, prompts[i], entries[i], offsets)
            text = prompt + text
        else:
            logprobs = shape.logprobs(entries[i], offsets)
        choices.append(shape.choice(i, text, reasons[i], logprobs))
    return choices


def _request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


async def _serve(
    request: Request, engine: AsyncEngine, prepared: PreparedRequest, chat: bool, stream: bool, include_usage: bool,
    ticket: Ticket,
) -> Response:
    request_id = _request_id(chat)
    params = prepared.params
    token_text = engine.tokenizer.token_text if params.logprobs is not None else None
    shape = ResponseShape(chat, request_id, engine.served_model_name, tool_format=prepared.tool_format,
                          reasoning=prepared.reasoning, token_text=token_text, echo=prepared.echo, n=params.n)
    jobs = fan_out(request_id, prepared)
    usage = UsageTracker([len(p) for p in prepared.prompts], prepared.params.n)
    logger.debug(
        "request_start request_id=%s prompts=%d prompt_tokens=%s n=%d max_tokens=%d stream=%s cache=%s",
        request_id, len(prepared.prompts), usage.prompt_lens, prepared.params.n, prepared.params.max_tokens, stream,
        ticket.status,
    )
    outputs = with_deadline(ticket.record(merge_choices(engine, jobs), usage.prompt_lens, prepared.params.n),
                            prepared.timeout_s)
    streaming = False
    try:
        if stream:
            first = await until_disconnect(request, first_output(outputs))  # errors before a token get a status
            raise_if_failed(first[1])
            body = sse_events(shape, first, outputs, usage, len(jobs), include_usage)
            streaming = True  # the stream's end releases the ticket
            headers = {"Cache-Control": "no-cache", **ticket.headers}
            return StreamingResponse(body, media_type="text/event-stream", headers=headers)
        choices = await until_disconnect(request, _collect(outputs, usage, shape, len(jobs)))
    except ClientDisconnected:
        logger.info("client_disconnected request_id=%s", request_id)
        return Response(status_code=CLIENT_CLOSED_REQUEST, headers=ticket.headers)
    except BaseException:
        await outputs.aclose()  # type: ignore[attr-defined]
        raise
    finally:
        if not streaming:
            ticket.release()
    body = {**shape.header(streaming=False), "choices": choices, "usage": usage.body()}
    return JSONResponse(body, headers=ticket.headers)


async def _serve_cached(
    state: ServerState, request: Request, req: ChatCompletionRequest | CompletionRequest,
    prepare: Callable[[Any, AsyncEngine], PreparedRequest],
) -> Response:
    """Answer from the response cache on a hit; otherwise prepare and serve (and maybe keep) it."""
    chat = isinstance(req, ChatCompletionRequest)
    if state.request_log is not None:  # --log-requests: the body as sent (FastAPI has read it already)
        state.request_log.write(CHAT if chat else COMPLETIONS, await request.body())
    engine = state.ready_engine()
    ticket = await state.response_cache.lookup(CHAT if chat else COMPLETIONS, req, request, engine)
    if ticket.value is not None:
        fmt = reply_format(req, engine.tokenizer, state.server_cfg.tool_call_parser) if chat else None  # type: ignore[arg-type]
        cfg = state.server_cfg
        thinks = reply_reasoning(req, engine.tokenizer, cfg.reasoning_parser) if chat else None  # type: ignore[arg-type]
        shape = ResponseShape(chat, _request_id(chat), engine.served_model_name, tool_format=fmt, reasoning=thinks)
        return replay(ticket.value, shape, req.stream, req.include_usage, ticket.headers)
    try:
        # template, tokenizer and schema checks are CPU work: off the event loop, which serves every stream
        prepared = scoped_to_tenant(await asyncio.to_thread(prepare, req, engine), request_tenant(request))
        return await _serve(request, engine, prepared, chat, req.stream, req.include_usage, ticket)
    except BaseException:
        ticket.release()  # identical misses waiting on this one look again
        raise


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(
        title="kvstrata", description="OpenAI-compatible LLM server with a tiered prefix KV cache",
        redirect_slashes=False,  # no 307 to the slash-less path: an API client gets a JSON 404 instead
    )
    app.state.kvstrata = state
    install_error_handlers(app)
    # outermost last: the cache header on errors, draining 503 and in-flight count, the API key, body limits
    cfg = state.server_cfg
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=cfg.max_request_body_bytes,
                       max_json_depth=cfg.max_json_depth, body_timeout_s=cfg.request_body_timeout)
    app.add_middleware(AuthMiddleware, keys=state.api_keys, metrics_public=cfg.metrics_public)
    app.add_middleware(LifecycleMiddleware, lifecycle=state.lifecycle)
    app.add_middleware(CacheHeaderOnErrors)  # x-kvstrata-cache: bypass on every error of the completion routes
    app.add_middleware(AnthropicErrors)  # /v1/messages errors, from every layer above, in Anthropic's shape
    install_health_route(app, state)  # /health, /health?deep=1

    def model_card(engine: AsyncEngine) -> dict[str, Any]:
        return {
            "id": engine.served_model_name, "object": "model", "created": int(time.time()),
            "owned_by": "kvstrata", "max_model_len": engine.max_model_len,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(state.ready_engine())]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        engine = state.ready_engine()
        check_model(model_id, engine)
        return model_card(engine)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        parser, reasoning = state.server_cfg.tool_call_parser, state.server_cfg.reasoning_parser
        return await _serve_cached(state, request, req, lambda r, e: prepare_chat(r, e, parser, reasoning))

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        return await _serve_cached(state, request, req, prepare_completion)

    install_responses_route(app, state)  # /v1/responses (serving/responses/)
    install_messages_routes(app, state)  # /v1/messages, Anthropic's (serving/messages/)
    install_tokenize_routes(app, state)  # /tokenize, /detokenize, vLLM's
    install_admin_routes(app, state)
    install_rank_info_route(app, state)  # /v1/kvstrata/info, for the DP gateway
    install_worker_info_routes(app, state)  # /server_info, /model_info, for SGLang Model Gateway
    return app
