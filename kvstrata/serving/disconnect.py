"""Aborting the work of a non-streamed request whose HTTP client has left.

A streamed answer learns it at its next write (the generator is closed); a non-streamed one would
go on generating until done, so its awaitable runs under `until_disconnect`, which polls
`request.is_disconnected()` and cancels it (closing its engine streams aborts their requests).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request

T = TypeVar("T")
DISCONNECT_POLL_S = 0.2
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it


class ClientDisconnected(Exception):
    """The HTTP client closed the connection before the response was ready."""


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, cancelling it (which aborts its engine requests) if the client leaves."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
