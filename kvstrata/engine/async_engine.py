"""AsyncEngine: the engine thread the HTTP server drives.

Requests cross into the engine thread through a thread-safe inbox; outputs cross back with
`loop.call_soon_threadsafe` into a per-request asyncio.Queue. A consumer that stops iterating
aborts its request, whose pages go back to the pool at the next step. A constrained request's
matcher is compiled (or copied from the cache, grammar_cache.py) in a compile thread before the
request enters the inbox, so no grammar ever stalls the step loop. If the engine thread dies,
`healthy` turns False and every waiting stream fails with EngineDeadError.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from typing import Any, AsyncIterator, Callable

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.engine import Engine
from kvstrata.engine.grammar_cache import COMPILE_THREAD
from kvstrata.engine.outputs import EngineDeadError, RequestOutput
from kvstrata.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

_Stream = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[RequestOutput | BaseException]"]


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.served_model_name = engine.info.served_model_name
        self.max_model_len = engine.info.max_model_len
        self.vocab_size = engine.info.arch.vocab_size
        self.sched_cfg = engine.sched_cfg
        # observers, called on the engine thread: every output, and finished outputs
        self.on_output: list[Callable[[RequestOutput], None]] = []
        self.on_finish: list[Callable[[RequestOutput], None]] = []
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._dead: BaseException | None = None
        self._stopping = False
        # one thread compiles grammars: llguidance drops the GIL there, and a core stays for the steps
        self._compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=COMPILE_THREAD)
        self._thread = threading.Thread(target=self._run, name="kvstrata-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig) -> AsyncEngine:
        return cls(Engine(model_cfg, cache_cfg, sched_cfg))

    @property
    def healthy(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    def check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> SamplingParams:
        return self.engine.check_request(prompt_token_ids, params)

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        if not self.healthy:
            raise EngineDeadError("the engine is not running")
        params = self.check_prompt(prompt_token_ids, params)
        matcher = None
        if params.grammar is not None:  # compiled (or copied) here, never on the engine thread
            matcher = await asyncio.get_running_loop().run_in_executor(
                self._compiler, self.engine.grammars.matcher, params.grammar)
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), q)
        self._inbox.put(("add", (request_id, list(prompt_token_ids), params, matcher)))
        if not self.healthy:  # died between the check above and registering: nobody would answer
            self._streams.pop(request_id, None)
            raise EngineDeadError("the engine is not running")
        done = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                yield item
                if done:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not done:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def call(self, fn: Callable[[Engine], Any]) -> asyncio.Future[Any]:
        """Run fn(engine) on the engine thread between steps (admin routes, integrity checks)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inbox.put(("call", (fn, fut)))
        return fut

    def call_blocking(self, fn: Callable[[Engine], Any]) -> Any:
        """Run fn(engine) on the engine thread between steps and wait for its result, from a thread
        with no event loop (the server's loader runs the warm-up so). Raises EngineDeadError if the
        engine thread is gone or dies before it answers."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._inbox.put(("call_blocking", (fn, fut)))
        while True:
            try:
                return fut.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if not self.healthy:
                    raise EngineDeadError("the engine is not running") from None

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._inbox.put(("stop", None))
        self._thread.join(timeout)
        # the flush walks L1/L2, which only the engine thread may touch: skip it if that thread is
        # still running (stuck in a step); in-flight writes are still drained
        self.engine.close(timeout, flush=not self._thread.is_alive())
        self._compiler.shutdown(wait=False)

    # -- engine thread ---------------------------------------------------------------------
    def _send(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        loop, q = stream
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "add":
            request_id, ids, params, matcher = payload
            try:
                self.engine.add_request(request_id, ids, params, matcher)
            except Exception as exc:
                self._send(request_id, exc)
        elif kind == "abort":
            out = self.engine.abort_request(payload)
            if out is not None:
                self._notify(out)
        elif kind == "call":
            fn, fut = payload
            try:
                result: Any = fn(self.engine)
                fut.get_loop().call_soon_threadsafe(_resolve, fut, result, None)
            except Exception as exc:
                fut.get_loop().call_soon_threadsafe(_resolve, fut, None, exc)
        elif kind == "call_blocking":
            fn, cfut = payload
            try:
                cfut.set_result(fn(self.engine))
            except Exception as exc:
                cfut.set_exception(exc)

    def _drain(self, block: bool) -> None:
        try:
            kind, payload = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
            while True:
                if kind != "stop":
                    self._handle(kind, payload)
                kind, payload = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _notify(self, out: RequestOutput) -> None:
        observers = self.on_output + self.on_finish if out.finished else self.on_output
        for fn in observers:
            try:
                fn(out)
            except Exception:  # an observer must never take the engine down
                log.exception("on_finish observer failed")

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain(block=not self.engine.has_unfinished())
                if not self.engine.has_unfinished():
                    continue
                for out in self.engine.step():
                    self._notify(out)
                    self._send(out.request_id, out)
        except BaseException as exc:
            self._dead = exc
            log.exception("engine thread died")
            for request_id in list(self._streams):
                self._send(request_id, EngineDeadError(f"the engine died: {type(exc).__name__}: {exc}"))


def _resolve(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
