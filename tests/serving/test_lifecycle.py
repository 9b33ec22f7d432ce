"""Health while loading and after death, engine failures, client disconnects, run_server itself."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import openai
import pytest

from kvstrata.config import ModelConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.engine.outputs import EngineDeadError, EngineOverloadedError, RequestOutput
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.serving.server import load_engine_in_background
from serving_support import USER, RecordingEngine, assert_error, make_state, openai_client, serve


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_health_ready(http: httpx.Client) -> None:
    resp = http.get("/health")
    assert (resp.status_code, resp.json()) == (200, {"status": "ready"})


def test_health_while_loading_then_ready(make_engine: Callable[[], AsyncEngine], model_cfg: ModelConfig) -> None:
    go = threading.Event()
    state = make_state()

    def loader() -> AsyncEngine:
        go.wait(10)
        return make_engine()

    with serve(state) as srv, httpx.Client(base_url=srv.base_url) as http:
        load_engine_in_background(state, loader)
        resp = http.get("/health")
        assert (resp.status_code, resp.json()) == (503, {"status": "loading"})
        assert_error(http.post("/v1/completions", json={"prompt": "x"}), 503, code="model_loading")
        assert_error(http.get("/v1/models"), 503, code="model_loading")
        go.set()
        assert wait_for(lambda: http.get("/health").status_code == 200, 20)
        out = openai_client(srv).completions.create(model=Path(model_cfg.model).name, prompt="x", max_tokens=1)
        assert len(out.choices) == 1
    assert state.engine is not None
    state.engine.shutdown()


def test_failed_load_reports_dead() -> None:
    state = make_state()

    def loader() -> AsyncEngine:
        raise FileNotFoundError("no weights in /nowhere")

    load_engine_in_background(state, loader).join()
    with serve(state) as srv, httpx.Client(base_url=srv.base_url) as http:
        resp = http.get("/health")
        assert resp.status_code == 503 and resp.json()["status"] == "dead"
        assert "no weights" in resp.json()["error"]
        assert "no weights" in assert_error(http.post("/v1/completions", json={"prompt": "x"}), 503, code="engine_dead")


def test_dead_engine_answers_503_fast(make_engine: Callable[[], AsyncEngine], model_name: str) -> None:
    eng = make_engine()
    eng.shutdown()
    with serve(make_state(eng)) as srv, httpx.Client(base_url=srv.base_url) as http:
        assert http.get("/health").json()["status"] == "dead"
        # refused up front by the health check (engine_dead), not after waiting on the dead engine
        with pytest.raises(openai.InternalServerError) as info:
            openai_client(srv, timeout=30).chat.completions.create(model=model_name, messages=USER)
        assert info.value.status_code == 503 and info.value.code == "engine_dead"


class FaultyEngine(RecordingEngine):
    """Fails requests by seed: 1 raises at once, 2 dies mid-stream, 3 reports an engine error, 5 is busy."""

    async def generate(self, request_id: str, ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        if params.seed == 1:
            raise RuntimeError("boom before any token")
        if params.seed == 5:
            raise EngineOverloadedError("64 requests are waiting")
        count = 0
        async for out in super().generate(request_id, ids, params):
            count += 1
            if params.seed == 2 and count == 3:
                raise EngineDeadError("the engine died mid-request")
            if params.seed == 3 and out.finished:
                out.finish_reason, out.error = "error", "CUDA out of memory"
            yield out


@pytest.fixture(scope="module")
def faulty(engine: AsyncEngine) -> Any:
    with serve(make_state(FaultyEngine(engine))) as srv:
        yield srv


def test_engine_exception_fails_only_that_request(faulty: Any, model_name: str) -> None:
    client = openai_client(faulty)
    kw: dict[str, Any] = {"model": model_name, "messages": USER, "max_tokens": 5, "extra_body": {"ignore_eos": True}}
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(seed=1, **kw)
    assert info.value.status_code == 500 and "boom" in info.value.message
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(seed=3, **kw)
    assert info.value.status_code == 500 and "CUDA out of memory" in info.value.message
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(seed=2, **kw)
    assert info.value.status_code == 503
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(seed=5, **kw)
    assert "64 requests are waiting" in info.value.message
    assert client.chat.completions.create(seed=4, **kw).choices[0].finish_reason == "length"


def test_engine_exception_mid_stream_is_an_error_event(faulty: Any, model_name: str) -> None:
    stream = openai_client(faulty).chat.completions.create(
        model=model_name, messages=USER, max_tokens=20, seed=2, stream=True, extra_body={"ignore_eos": True}
    )
    got = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            got.append(chunk)
    assert "engine died" in info.value.message and len(got) >= 1


@pytest.fixture()
def recorder(engine: AsyncEngine) -> Any:
    rec = RecordingEngine(engine)
    with serve(make_state(rec)) as srv:
        yield rec, srv


LONG = {"prompt": "tell me a long story", "max_tokens": 1900, "ignore_eos": True}


def test_disconnect_aborts_non_streaming_request(recorder: Any, engine: AsyncEngine, model_name: str) -> None:
    rec, srv = recorder
    with httpx.Client(base_url=srv.base_url, timeout=0.3) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/completions", json={"model": model_name, **LONG})
    assert wait_for(lambda: list(rec.ended.values()) == ["closed"], 3), rec.ended
    assert wait_for(lambda: not engine.engine.has_unfinished(), 3)


def test_disconnect_aborts_stream(recorder: Any, engine: AsyncEngine, model_name: str) -> None:
    rec, srv = recorder
    with httpx.Client(base_url=srv.base_url, timeout=10) as http:
        with http.stream("POST", "/v1/completions", json={"model": model_name, "stream": True, **LONG}) as resp:
            lines = resp.iter_lines()
            assert next(lines).startswith("data: ")
    assert wait_for(lambda: list(rec.ended.values()) == ["closed"], 3), rec.ended
    assert wait_for(lambda: not engine.engine.has_unfinished(), 3)


def test_run_server_warms_up_serves_and_stops(tiny_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "from kvstrata.config import *; from kvstrata.config_server import ServerConfig; "
        "from kvstrata.serving.server import run_server; "
        f"run_server(ModelConfig(model={str(tiny_model_dir)!r}, dtype='float32', max_model_len=256), "
        f"CacheConfig(max_total_tokens=1024), SchedulerConfig(), ServerConfig(port={port}, log_level='info'))"
    )
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONUNBUFFERED": "1"}, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/health").status_code == 200
            except httpx.TransportError:
                return False

        assert wait_for(ready, 40)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        out = client.completions.create(model=tiny_model_dir.name, prompt="hi", max_tokens=2)
        assert out.usage is not None and out.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        log.close()
    text = (tmp_path / "server.log").read_text()
    # the default warm-up: the step budget (2048) capped by max_model_len 256, before "engine_ready"
    assert "warm-up: one 255-token prefill step and a 8-row decode step" in text, text
    assert text.index("warm-up: one") < text.index("engine_ready"), text
