"""What the response cache stores for a request (`CachedResponse`) and how a hit is answered.

A hit goes through the same code as a live response: its choices become finished
`RequestOutput`s fed to `UsageTracker`, `ResponseShape` and `sse_events`, so a replayed JSON body
or SSE stream has the shape of a live one (role chunk, content chunk, finish_reason, optional
usage chunk, [DONE]). Usage reports the stored prompt and completion tokens, with
cached_tokens = prompt tokens: nothing was computed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvstrata.engine.outputs import RequestOutput
from kvstrata.serving.streaming import ResponseShape, UsageTracker, sse_events

FINISHED_NORMALLY = ("stop", "length")  # the only results worth keeping


@dataclass(frozen=True)
class CachedChoice:
    text: str
    finish_reason: str
    output_tokens: int


@dataclass(frozen=True)
class CachedResponse:
    """One finished response: choice p*n + i is the i-th choice of prompt p."""

    prompt_lens: tuple[int, ...]
    n: int
    choices: tuple[CachedChoice, ...]

    def outputs(self, request_id: str) -> list[tuple[int, RequestOutput]]:
        """Each choice as the one finished output a live request would end with."""
        outs = []
        for index, choice in enumerate(self.choices):
            prompt = self.prompt_lens[index // self.n]
            out = RequestOutput(
                f"{request_id}-{index}", [], choice.text, finished=True, finish_reason=choice.finish_reason,
                prompt_tokens=prompt, cached_tokens=prompt, output_tokens=choice.output_tokens,
            )
            outs.append((index, out))
        return outs


async def _replay(outputs: list[tuple[int, RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    for item in outputs:
        yield item


def replay(
    value: CachedResponse, shape: ResponseShape, stream: bool, include_usage: bool, headers: dict[str, str]
) -> Response:
    """The JSON body or SSE stream of a cache hit."""
    usage = UsageTracker(list(value.prompt_lens), value.n)
    outputs = value.outputs(shape.request_id)
    if stream:
        body = sse_events(shape, outputs[0], _replay(outputs[1:]), usage, len(outputs), include_usage)
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **headers})
    for index, out in outputs:
        usage.observe(index, out)
    choices = [shape.choice(index, out.new_text, out.finish_reason) for index, out in outputs]
    return JSONResponse({**shape.header(streaming=False), "choices": choices, "usage": usage.body()}, headers=headers)
