"""Token streams: fan a request's choices into the engine, merge their outputs, encode SSE chunks.

One HTTP request with P prompts and n choices becomes P*n engine requests (`ChoiceJob`, choice
index p*n + i). `merge_choices` runs them concurrently and yields `(index, RequestOutput)`; closing
it (client gone, error, generator closed) cancels every unfinished engine request. `sse_events`
turns the merged stream into OpenAI `data: {...}` chunks ending with `data: [DONE]`; an error
after the stream began is sent as a `data: {"error": {...}}` event, which OpenAI clients raise.
With a reasoning parser (serving/reasoning.py) a chat choice's reasoning is `message.reasoning_content`
(streamed: `delta.reasoning_content`), as vLLM answers; tool calls are read from the content after it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, AsyncIterator

from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.logprobs import TokenLogprob
from kvstrata.serving.errors import APIError, api_error_from, error_body
from kvstrata.serving.logprob_shapes import CompletionOffsets, TokenText, chat_logprobs, completion_logprobs
from kvstrata.serving.prepare import PreparedRequest
from kvstrata.serving.reasoning import ReasoningSplitter, split_reasoning
from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.output import ToolCallStream, chat_message, stream_delta

if TYPE_CHECKING:
    from kvstrata.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)
DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, allow_nan=False)}\n\n"


@dataclass(frozen=True)
class ChoiceJob:
    index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


def fan_out(request_id: str, prepared: PreparedRequest) -> list[ChoiceJob]:
    """The engine takes n=1: choice i of each prompt samples with seed + i when a seed is given."""
    params, n = prepared.params, prepared.params.n
    per_choice = [replace(params, n=1, seed=None if params.seed is None else params.seed + i) for i in range(n)]
    return [
        ChoiceJob(p * n + i, f"{request_id}-{p * n + i}", ids, per_choice[i])
        for p, ids in enumerate(prepared.prompts)
        for i in range(n)
    ]


async def first_output(outputs: AsyncIterator[tuple[int, RequestOutput]]) -> tuple[int, RequestOutput]:
    """The first (choice index, output) of a merged stream: a stream's status waits for it."""
    return await outputs.__anext__()


def raise_if_failed(out: RequestOutput) -> None:
    if out.finish_reason == "error":
        msg = f"generation failed: {out.error or 'unknown engine error'}"
        raise APIError(500, msg, "server_error", code="generation_error")
    if out.finish_reason == "abort":
        msg = "the engine aborted this request (shutting down?); retry it"
        raise APIError(503, msg, "server_error", code="aborted")


async def merge_choices(engine: AsyncEngine, jobs: list[ChoiceJob]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yield (choice index, output) from all jobs as they arrive; the first engine error is raised."""
    queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = asyncio.Queue()
    unfinished = {job.index: job.request_id for job in jobs}

    async def pump(job: ChoiceJob) -> None:
        finished = False
        try:
            async with aclosing(engine.generate(job.request_id, job.prompt_token_ids, job.params)) as outs:
                async for out in outs:
                    finished = out.finished
                    queue.put_nowait((job.index, out, None))
            if not finished:
                raise RuntimeError(f"the engine stream of {job.request_id} ended before the request finished")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((job.index, None, exc))

    tasks = [asyncio.create_task(pump(job), name=job.request_id) for job in jobs]
    try:
        while unfinished:
            index, out, exc = await queue.get()
            if exc is not None:
                raise exc
            assert out is not None
            if out.finished:
                unfinished.pop(index, None)
            yield index, out
    finally:
        for task in tasks:
            task.cancel()
        for request_id in unfinished.values():
            logger.info("request_aborted request_id=%s", request_id)
            engine.abort(request_id)


@dataclass
class UsageTracker:
    """Token counts of one HTTP request: prompts counted once, completions summed over choices."""

    prompt_lens: list[int]
    n: int
    output_tokens: dict[int, int] = field(default_factory=dict)
    cached_tokens: dict[int, int] = field(default_factory=dict)

    def observe(self, index: int, out: RequestOutput) -> None:
        self.output_tokens[index] = out.output_tokens
        self.cached_tokens[index] = out.cached_tokens

    def body(self) -> dict[str, Any]:
        prompt = sum(self.prompt_lens)
        completion = sum(self.output_tokens.values())
        # per prompt, the prefix every one of its choices got from cache
        cached = sum(
            min((self.cached_tokens.get(p * self.n + i, 0) for i in range(self.n)), default=0)
            for p in range(len(self.prompt_lens))
        )
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }


@dataclass(frozen=True)
class ResponseShape:
    """The fixed fields of one response and how a chat or text choice is spelled."""

    chat: bool
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    tool_format: ToolCallFormat | None = None  # chat with tools: replies are parsed for tool calls
    reasoning: str | None = None  # chat: the reasoning parser (None: replies are all content)
    token_text: TokenText | None = None  # the request asked for logprobs: a token's text (serving/logprob_shapes.py)
    echo: list[tuple[str, list[int]]] | None = None  # completions' echo: each prompt's text and tokens
    n: int = 1  # choices per prompt: choice i echoes prompt i // n

    def header(self, streaming: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if streaming else "chat.completion") if self.chat else "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str, finish_reason: str | None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            reasoning, text = split_reasoning(self.reasoning, text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self.tool_format is not None:
                message, finish_reason = chat_message(self.tool_format, text, finish_reason)
            if self.reasoning is not None:
                message["reasoning_content"] = reasoning
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def echoed(self, index: int, prompt: list[TokenLogprob | None] | None, entries: list[TokenLogprob],
               offsets: CompletionOffsets) -> tuple[str, dict[str, Any] | None]:
        """The echoed prompt's text, and the logprobs of its tokens (`prompt`) then of `entries` (the first
        output's) when asked for: what a choice's text and logprobs start with under `echo`."""
        assert self.echo is not None
        text, ids = self.echo[index // self.n]
        if self.token_text is None:
            return text, None
        return text, completion_logprobs([*(prompt or [None] * len(ids)), *entries], self.token_text, ids[:1],
                                         offsets)

    def logprobs(self, entries: list[TokenLogprob], offsets: CompletionOffsets) -> dict[str, Any] | None:
        """The logprobs of new tokens in this route's shape; None when not asked for."""
        if self.token_text is None:
            return None
        if self.chat:
            return chat_logprobs(entries, self.token_text)
        return completion_logprobs(list(entries), self.token_text, [], offsets)

    def chunk(
        self, index: int, text: str, finish_reason: str | None, first: bool = False,
        tool_calls: list[dict[str, Any]] | None = None, reasoning: str = "", logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"content": text} if text or first else {}
            if reasoning:
                delta["reasoning_content"] = reasoning
            if tool_calls:
                delta["tool_calls"] = tool_calls
            if first:
                delta = {"role": "assistant", **delta}
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = self.choice(index, text, finish_reason, logprobs)
        return {**self.header(streaming=True), "choices": [choice]}


async def sse_events(
    shape: ResponseShape,
    first: tuple[int, RequestOutput],
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    usage: UsageTracker,
    num_choices: int,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE body of a streamed response; closing it aborts the engine requests left."""
    extra = {"usage": None} if include_usage else {}
    tool_streams: dict[int, ToolCallStream] = {}
    splitters: dict[int, ReasoningSplitter] = {}
    offsets: dict[int, CompletionOffsets] = {}

    def event(index: int, out: RequestOutput) -> str | None:
        usage.observe(index, out)
        raise_if_failed(out)
        text, reason, calls, thought = out.new_text, out.finish_reason, None, ""
        if index not in offsets and shape.echo is not None:  # a choice's first chunk starts with its prompt
            at = offsets[index] = CompletionOffsets()
            prompt, logprobs = shape.echoed(index, out.prompt_logprobs, out.new_logprobs or [], at)
            text = prompt + text
        else:
            logprobs = shape.logprobs(out.new_logprobs or [], offsets.setdefault(index, CompletionOffsets()))
        if shape.reasoning is not None and shape.chat:
            splitter = splitters.setdefault(index, ReasoningSplitter(shape.reasoning))
            thought, text = splitter.feed(text, out.finished)
        if shape.tool_format is not None and shape.chat:
            text, calls, reason = stream_delta(tool_streams, shape.tool_format, index, text, reason)
        if not (text or calls or thought or out.finished or (logprobs and out.new_token_ids)):
            return None
        chunk = shape.chunk(index, text, reason, tool_calls=calls, reasoning=thought, logprobs=logprobs)
        return sse({**chunk, **extra})

    try:
        if shape.chat:
            for index in range(num_choices):
                yield sse({**shape.chunk(index, "", None, first=True), **extra})
        text = event(*first)
        if text is not None:
            yield text
        async for index, out in outputs:
            text = event(index, out)
            if text is not None:
                yield text
        if include_usage:
            yield sse({**shape.header(streaming=True), "choices": [], "usage": usage.body()})
        yield DONE
    except Exception as exc:  # noqa: BLE001 - reported in-band: the 200 status is already sent
        err = api_error_from(exc)
        logger.warning(
            "stream_failed request_id=%s status=%d error=%s", shape.request_id, err.status_code, err.message
        )
        yield sse(error_body(err.message, err.type, err.param, err.code or err.status_code))
        yield DONE
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]
