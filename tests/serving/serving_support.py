"""Helpers the serving tests share: a server over any state, clients, an engine wrapper that records."""
from __future__ import annotations

import contextlib
from contextlib import aclosing
from typing import Any, AsyncIterator, Iterator

import httpx
import openai

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.server import ServerThread
from kvstrata.serving.state import ServerState

SCHED = SchedulerConfig(max_n=4, max_stop_strings=4)
CACHE = CacheConfig(max_total_tokens=16384, page_size=16)
MAX_MODEL_LEN = 2048  # room for a generation long enough to be cancelled mid-way (about 3 s)
USER = [{"role": "user", "content": "hi"}]


def make_state(engine: Any = None, server_cfg: ServerConfig | None = None) -> ServerState:
    """State for a server on a free port; engine None means 'still loading'."""
    state = ServerState(ModelConfig(), CacheConfig(), SCHED, server_cfg or ServerConfig(port=0))
    if isinstance(engine, AsyncEngine):
        state.publish(engine)  # metrics observe it, as in the real server
    else:
        state.engine = engine
    return state


@contextlib.contextmanager
def serve(state: ServerState) -> Iterator[ServerThread]:
    """A real uvicorn server over `state` on a free loopback port, for the block's duration."""
    srv = ServerThread(state).start()
    try:
        yield srv
    finally:
        srv.stop()


def openai_client(srv: ServerThread, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=timeout)


def assert_error(resp: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> str:
    """Check an OpenAI-style error body; return its message."""
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err["message"]


class RecordingEngine:
    """The real engine behind a wrapper that records how each generate() ended.

    `ended[request_id]` is "finished" or "closed" (the consumer stopped early). Subclasses inject
    faults by overriding `generate`.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ended: dict[str, str] = {}
        self.aborted: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.inner.abort(request_id)

    async def generate(self, request_id: str, ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        done = False
        try:
            async with aclosing(self.inner.generate(request_id, ids, params)) as outs:
                async for out in outs:
                    done = out.finished
                    yield out
        finally:
            self.ended[request_id] = "finished" if done else "closed"
