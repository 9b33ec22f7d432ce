"""The per-request `timeout` (seconds): past it the request's engine work is aborted and it gets 408.

Before the first byte is sent this is a 408 status; once a stream has started it is an in-band
`data: {"error": {..., "code": "timeout"}}` event, like any error after the status line.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, TypeVar

from kvstrata.serving.errors import APIError

T = TypeVar("T")


def request_timeout(timeout_s: float) -> APIError:
    return APIError(
        408, f"the request did not finish within its timeout of {timeout_s:g} s and was aborted; "
             "raise `timeout` or ask for fewer tokens", "timeout_error", param="timeout", code="timeout",
    )


async def _bounded(outputs: AsyncIterator[T], timeout_s: float) -> AsyncIterator[T]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise request_timeout(timeout_s)
            try:
                # cancelling the pending step closes `outputs`, which aborts its engine requests
                item = await asyncio.wait_for(outputs.__anext__(), remaining)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise request_timeout(timeout_s) from None
            yield item
    finally:
        await outputs.aclose()  # type: ignore[attr-defined]


def with_deadline(outputs: AsyncIterator[T], timeout_s: float | None) -> AsyncIterator[T]:
    """`outputs`, raising a 408 APIError (and closing them) once `timeout_s` has passed."""
    return outputs if timeout_s is None else _bounded(outputs, timeout_s)
