"""`POST /tokenize` and `POST /detokenize`: the served model's tokenizer over HTTP, with vLLM's field names.

/tokenize takes one of two bodies:
- a prompt, `{"prompt": str, "add_special_tokens": true}`: the text's ids, with the special tokens the
  tokenizer adds on its own (a BOS, for tokenizers that add one) unless `add_special_tokens` is false;
- a chat, `{"messages": [...], "tools"?, "chat_template_kwargs"?, "add_generation_prompt": true,
  "add_special_tokens": false}`: the ids of the prompt /v1/chat/completions runs for the same messages
  (the same rendering and checks, `prepare.render_chat`), so `count` is that request's `prompt_tokens`.
It answers `{"count", "max_model_len", "tokens"}`, plus `token_strs` (the tokenizer's own pieces, such
as "Ġworld") when `return_token_strs` is true. /detokenize takes `{"tokens": [...]}` and answers
`{"prompt": text}`, special tokens written out, so a rendered chat comes back as the template wrote it.

Both refuse another model (404) and ids outside the vocabulary. Neither checks the context length, as
vLLM's do not: counting a text longer than the context, or cutting it into windows (`kvstrata bench
perplexity`), is what a client tokenizes for; the request body limit bounds the work.
vLLM's `continue_final_message` and a request's own `chat_template` are refused, not ignored: the
count would not be the prompt the client meant. Encoding, rendering and decoding are CPU work, so
they run in a worker thread, off the event loop that carries every stream.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from kvstrata.engine.sampling_params import InvalidRequestError
from kvstrata.serving.errors import validation_error_to_api_error
from kvstrata.serving.prepare import check_model, render_chat
from kvstrata.serving.protocol import ChatCompletionRequest

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine
    from kvstrata.serving.state import ServerState

_STRICT = ConfigDict(strict=True, extra="ignore")  # as protocol.py: no coercion, unknown fields ignored
_CHAT_FIELDS = ("model", "messages", "tools", "chat_template_kwargs")  # what the chat request is built from


class TokenizeRequest(BaseModel):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one body: `prompt` or `messages`."""

    model_config = _STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None  # checked as /v1/chat/completions checks them
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # None: true for a prompt, false for messages (vLLM's defaults)
    return_token_strs: bool | None = False
    continue_final_message: bool = False  # refused when true
    chat_template: str | None = None  # refused when given

    def refuse_unsupported(self) -> None:
        """Exactly one of prompt and messages, and no feature this server cannot honour: 400 naming the field."""
        if self.prompt is None and self.messages is None:
            raise InvalidRequestError("send either prompt (a string) or messages (a chat); the body has neither",
                                      "prompt")
        if self.prompt is not None and self.messages is not None:
            raise InvalidRequestError("send either prompt or messages, not both", "messages")
        if self.continue_final_message:
            msg = "continue_final_message is not supported; omit it (the prompt ends as add_generation_prompt says)"
            raise InvalidRequestError(msg, "continue_final_message", "unsupported")
        if self.chat_template is not None:
            msg = "chat_template is not supported; omit it (the served model's own template is used)"
            raise InvalidRequestError(msg, "chat_template", "unsupported")

    def chat_request(self) -> ChatCompletionRequest:
        """The chat request whose prompt /tokenize counts (its validation's 400s name the field)."""
        body = {name: getattr(self, name) for name in _CHAT_FIELDS if getattr(self, name) is not None}
        try:
            return ChatCompletionRequest.model_validate(body)
        except ValidationError as exc:
            raise validation_error_to_api_error(exc.errors()) from None


class DetokenizeRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    tokens: list[int]


def tokenize(req: TokenizeRequest, engine: AsyncEngine, tool_call_parser: str) -> dict[str, Any]:
    """The /tokenize answer (CPU work: call it off the event loop)."""
    tokenizer = engine.tokenizer
    if req.prompt is not None:
        ids = tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens is not False)
    else:
        _, text = render_chat(req.chat_request(), tokenizer, tool_call_parser, req.add_generation_prompt)
        ids = tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))
    body: dict[str, Any] = {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}
    if req.return_token_strs:
        body["token_strs"] = [tokenizer.backend.id_to_token(i) for i in ids]
    return body


def detokenize(req: DetokenizeRequest, engine: AsyncEngine) -> dict[str, Any]:
    """The /detokenize answer (CPU work: call it off the event loop). The vocabulary is the tokenizer's:
    an id beyond it has no text to give."""
    vocab = engine.tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"token ids {bad[:8]} are outside the vocabulary [0, {vocab})", "tokens")
    return {"prompt": engine.tokenizer.decode(req.tokens, skip_special_tokens=False)}


def install_tokenize_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize_route(req: TokenizeRequest) -> JSONResponse:
        engine = state.ready_engine()
        check_model(req.model, engine)
        req.refuse_unsupported()
        return JSONResponse(await asyncio.to_thread(tokenize, req, engine, state.server_cfg.tool_call_parser))

    @app.post("/detokenize")
    async def detokenize_route(req: DetokenizeRequest) -> JSONResponse:
        engine = state.ready_engine()
        check_model(req.model, engine)
        return JSONResponse(await asyncio.to_thread(detokenize, req, engine))
