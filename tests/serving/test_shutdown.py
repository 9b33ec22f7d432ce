"""Graceful drain (in-process and a real SIGTERM), exit 1 when the engine dies, /health?deep=1, and
on SIGTERM the L3 store gets every page it missed, while a hung store cannot hold the exit."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.shutdown import Lifecycle, drain_then_stop, watch_engine
from polling import wait_for
from serving_support import assert_error, make_state, serve

STORY = {"prompt": "once upon a time", "max_tokens": 120, "ignore_eos": True, "stream": True}


def read_stream(url: str, body: dict[str, Any], first: threading.Event, out: list[Any]) -> None:
    """Stream a completion, set `first` at its first chunk, append the parsed events to `out`."""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        out.append(resp.status_code)
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                first.set()


def finished_text_stream(events: list[Any]) -> bool:
    return events[0] == 200 and events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"


def test_drain_refuses_new_work_and_finishes_running(engine: AsyncEngine) -> None:
    with serve(make_state(engine)) as srv:
        first, events = threading.Event(), []  # type: ignore[var-annotated]
        reader = threading.Thread(target=read_stream, args=(srv.base_url, STORY, first, events))
        reader.start()
        assert first.wait(20)
        drainer = srv.drain(timeout_s=30)
        with httpx.Client(base_url=srv.base_url, timeout=10) as http:
            assert_error(http.post("/v1/completions", json={"prompt": "new"}), 503, code="shutting_down")
            health = http.get("/health")
            assert (health.status_code, health.json()) == (503, {"status": "draining"})
        reader.join(30)
        assert finished_text_stream(events), events[-2:]
        drainer.join(10)
        assert not drainer.is_alive() and srv._server.should_exit


def test_drain_gives_up_after_the_timeout() -> None:
    """A request that never ends does not hold the stop back: it stops with the request still in flight."""
    lifecycle, stopped = Lifecycle(), threading.Event()
    lifecycle.enter()  # a request that never ends
    drainer = drain_then_stop(lifecycle, stopped.set, timeout_s=0.2)
    drainer.join(5)
    assert not drainer.is_alive() and stopped.is_set()
    assert lifecycle.draining and lifecycle.inflight == 1


def test_watchdog_stops_the_server_when_the_engine_dies(make_engine: Callable[[], AsyncEngine]) -> None:
    eng = make_engine()
    state, stopped = make_state(eng), threading.Event()
    watch_engine(state, stopped.set, interval_s=0.05)
    assert not stopped.wait(0.3)
    eng.shutdown()
    assert stopped.wait(5) and state.status == "dead"


def test_deep_health_checks_integrity_and_counts_pages(engine: AsyncEngine) -> None:
    with serve(make_state(engine)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert http.post("/v1/completions", json={"prompt": "hello " * 40, "max_tokens": 2}).status_code == 200
        resp = http.get("/health", params={"deep": 1})
        assert resp.status_code == 200, resp.text
        pages = resp.json()["pages"]
        total = pages["free"] + pages["cached"] + pages["tails"] + pages["in_use"]
        assert total == pages["total"] == engine.engine.pool.num_pages
        assert pages["cached"] >= 2 and pages["in_use"] == 0
        assert http.get("/health").json() == {"status": "ready"}  # shallow stays cheap


# -- the real process ------------------------------------------------------------------------------

def start_server(
    tiny_model_dir: Path, prelude: str = "", cache: dict[str, Any] | None = None, **server: Any
) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        f"import sys; {prelude}\n"
        "from kvstrata.config import *; from kvstrata.config_server import ServerConfig\n"
        "from kvstrata.serving.server import run_server\n"
        f"sys.exit(run_server(ModelConfig(model={str(tiny_model_dir)!r}, dtype='float32', max_model_len=512), "
        f"CacheConfig(**{ {'max_total_tokens': 4096, **(cache or {})}!r}), SchedulerConfig(), "
        f"ServerConfig(port={port}, log_level='warning', **{server!r})))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/health").status_code == 200
        except httpx.TransportError:
            return False

    if not wait_for(up, 60, interval_s=0.05):
        proc.kill()
        pytest.fail("the server did not come up")
    return proc, url


def test_sigterm_drains_then_exits_0(tiny_model_dir: Path) -> None:
    proc, url = start_server(tiny_model_dir, shutdown_timeout=30.0)
    try:
        first, events = threading.Event(), []  # type: ignore[var-annotated]
        reader = threading.Thread(target=read_stream, args=(url, STORY, first, events))
        reader.start()
        assert first.wait(20)
        proc.send_signal(signal.SIGTERM)
        reader.join(30)
        assert finished_text_stream(events), events[-2:]
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()


def test_engine_death_exits_nonzero(tiny_model_dir: Path) -> None:
    prelude = (
        "from kvstrata.engine.engine import Engine\n"
        "def broken(self): raise RuntimeError('scheduler bug')\n"
        "Engine.step = broken"
    )
    proc, url = start_server(tiny_model_dir, prelude=prelude)
    try:
        resp = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=20)
        assert resp.status_code == 503, resp.text
        assert proc.wait(timeout=20) == 1
    finally:
        proc.kill()


def test_sigterm_keeps_the_store_and_the_next_start_serves_from_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    store = {"kvstore_storage_backend": "file",
             "kvstore_storage_backend_extra_config": json.dumps({"path": str(tmp_path / "l3")})}
    body = {"prompt": "a prefix worth keeping across restarts " * 8, "max_tokens": 2, "temperature": 0}
    proc, url = start_server(tiny_model_dir, cache=store)
    try:
        first = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        proc.send_signal(signal.SIGTERM)  # drains requests, then the L3 writes still in flight
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    proc, url = start_server(tiny_model_dir, cache=store)
    try:
        again = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48  # the prefix came from the store
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_sigterm_flushes_to_the_store_the_pages_it_missed(tiny_model_dir: Path, tmp_path: Path) -> None:
    l3 = tmp_path / "l3"
    store = {"kvstore_storage_backend": "file", "kvstore_storage_backend_extra_config": json.dumps({"path": str(l3)}),
             "max_total_tokens": 8 * 16}  # L1 holds one prompt: the earlier ones live only in L2
    prompts = [f"prompt {i} of three, each long enough for several pages of KV " * 7 for i in range(3)]
    proc, url = start_server(tiny_model_dir, cache=store)
    try:
        l3.rename(tmp_path / "l3.away")  # the store becomes unreachable: every write-through fails
        l3.write_bytes(b"not a directory")
        first = [httpx.post(f"{url}/v1/completions", json={"prompt": p, "max_tokens": 4, "temperature": 0},
                            timeout=30).json() for p in prompts]
        assert all(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for r in first), first
        assert all(97 <= r["usage"]["prompt_tokens"] <= 120 for r in first)  # 6 full pages each
        l3.unlink()
        (tmp_path / "l3.away").rename(l3)  # back: only the shutdown flush can fill it now
        assert not [f for f in l3.rglob("*") if f.is_file()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
    assert len([f for f in l3.rglob("*") if f.is_file()]) >= 3 * 6
    proc, url = start_server(tiny_model_dir, cache=store)
    try:
        for p, before in zip(prompts, first):  # the oldest prompt was only in L2 at SIGTERM
            again = httpx.post(f"{url}/v1/completions", json={"prompt": p, "max_tokens": 4, "temperature": 0},
                               timeout=30).json()
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 6 * 16, again["usage"]
            assert again["choices"][0]["text"] == before["choices"][0]["text"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


HUNG_STORE = """
import threading
from kvstrata.kv.store import register_store
from kvstrata.kv.store.file_store import FileStore
class HungStore(FileStore):  # connects, then never answers
    def batch_exists(self, keys): threading.Event().wait()
    def batch_put(self, keys, values): threading.Event().wait()
register_store('hung', HungStore)
"""


def test_sigterm_with_a_hung_store_still_exits_0_in_time(tiny_model_dir: Path, tmp_path: Path) -> None:
    extra = {"path": str(tmp_path / "l3"), "call_timeout_s": 1.0}
    store = {"kvstore_storage_backend": "hung", "kvstore_storage_backend_extra_config": json.dumps(extra)}
    proc, url = start_server(tiny_model_dir, prelude=HUNG_STORE, cache=store, shutdown_timeout=5.0)
    try:
        for i in range(3):  # each write-through hangs in the store; the requests do not
            body = {"prompt": f"request {i} " + "with a prefix long enough to be written " * 6, "max_tokens": 2}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0  # no thread waits on the store forever, so the process can end
        assert time.monotonic() - t0 < 12.0
    finally:
        proc.kill()
