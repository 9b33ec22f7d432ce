"""`kvstrata serve --dp-size N`: N engine rank processes on loopback and the gateway on --port.

Rank r listens on 127.0.0.1:(port + 1 + r), or a free port when that one is taken, with its own
pool and caches, `data_parallel_rank = r` and, unless --kv-events-config says otherwise, KV events
on free loopback ports (the gateway reads them from `/v1/kvstrata/info`). CPU threads are split
between the ranks unless --num-threads is given. A rank process that dies is restarted after
1, 2, 4, ... 30 s (the backoff resets once a rank has stayed up a minute); meanwhile the gateway
marks it down and sends its requests elsewhere.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from kvstrata.config import CacheConfig, ModelConfig, RouterConfig, SchedulerConfig, ServerConfig
from kvstrata.kv.event_wire import KVEventsConfig

logger = logging.getLogger(__name__)

RANK_HOST = "127.0.0.1"
BACKOFF_S = (1.0, 30.0)  # first delay, most
STABLE_S = 60.0  # up this long: the next crash starts the backoff again
AUTO_EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*",
               "replay_endpoint": "tcp://127.0.0.1:*"}


def _rank_main(model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig) -> None:
    from kvstrata.serving.server import run_server

    run_server(model_cfg, cache_cfg, sched_cfg, server_cfg)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = RANK_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class RankSpec:
    rank: int
    configs: tuple[ModelConfig, CacheConfig, SchedulerConfig, ServerConfig]
    process: Any = None  # multiprocessing.Process
    started_at: float = 0.0
    failures: int = 0  # consecutive crashes
    restart_at: float | None = None

    @property
    def url(self) -> str:
        server_cfg = self.configs[3]
        return f"http://{server_cfg.host}:{server_cfg.port}"


def rank_specs(
    n: int, model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig,
    router_cfg: RouterConfig,
) -> list[RankSpec]:
    events = cache_cfg.kv_events_config
    if not KVEventsConfig.from_json(events).enabled and router_cfg.policy == "cache_aware":
        events = json.dumps(AUTO_EVENTS)
    threads = model_cfg.num_threads or max(1, (os.cpu_count() or 1) // n)
    specs = []
    for r in range(n):
        port = server_cfg.port + 1 + r
        if not port_is_free(RANK_HOST, port):
            port = free_port()
        specs.append(RankSpec(r, (
            replace(model_cfg, num_threads=threads),
            replace(cache_cfg, kv_events_config=events, data_parallel_rank=r),
            sched_cfg,
            replace(server_cfg, host=RANK_HOST, port=port, dp_size=1),
        )))
    return specs


class RankSupervisor:
    """Starts the rank processes and restarts any that dies, with backoff, until stop()."""

    def __init__(self, specs: list[RankSpec]) -> None:
        self.specs = specs
        self._ctx = mp.get_context("spawn")  # no forked torch/threads state in the children
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kvstrata-rank-supervisor", daemon=True)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.specs]

    def start(self) -> RankSupervisor:
        for spec in self.specs:
            self._spawn(spec)
        self._thread.start()
        return self

    def _spawn(self, spec: RankSpec) -> None:
        spec.process = self._ctx.Process(
            target=_rank_main, args=spec.configs, name=f"kvstrata-rank-{spec.rank}", daemon=True
        )
        spec.process.start()
        spec.started_at = time.monotonic()
        spec.restart_at = None
        logger.info("rank_start rank=%d pid=%d url=%s", spec.rank, spec.process.pid, spec.url)

    def _watch(self) -> None:
        while not self._stopping.wait(0.25):
            now = time.monotonic()
            for spec in self.specs:
                if spec.process is None or spec.process.is_alive():
                    continue
                if spec.restart_at is None:
                    if now - spec.started_at > STABLE_S:
                        spec.failures = 0
                    delay = min(BACKOFF_S[1], BACKOFF_S[0] * 2**spec.failures)
                    spec.failures += 1
                    spec.restart_at = now + delay
                    logger.warning(
                        "rank_exited rank=%d code=%s restart_in_s=%.0f", spec.rank, spec.process.exitcode, delay
                    )
                elif now >= spec.restart_at and not self._stopping.is_set():
                    self._spawn(spec)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)
        for spec in self.specs:
            if spec.process is not None and spec.process.is_alive():
                spec.process.terminate()
        for spec in self.specs:
            if spec.process is not None:
                spec.process.join(timeout)
                if spec.process.is_alive():
                    spec.process.kill()


def run_data_parallel(
    model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig,
    router_cfg: RouterConfig,
) -> None:
    """Serve N ranks behind the gateway until interrupted (blocking)."""
    from kvstrata.router.app import run_gateway

    specs = rank_specs(server_cfg.dp_size, model_cfg, cache_cfg, sched_cfg, server_cfg, router_cfg)
    supervisor = RankSupervisor(specs).start()
    try:
        run_gateway(supervisor.urls, server_cfg, router_cfg)
    finally:
        supervisor.stop()
