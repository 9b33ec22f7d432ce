"""`kvstrata serve --dp-size N`: N engine rank processes on loopback and the gateway on --port.

Rank r listens on 127.0.0.1 on the r-th port of --rank-ports, or else on a free port the launcher
picks and logs (`rank_start rank=r pid=... url=...`), with its own pool and caches,
`data_parallel_rank = r` and, unless --kv-events-config says otherwise, KV events on free loopback
ports (the gateway reads them from `/v1/kvstrata/info`). A gateway port or rank port in use is a
ConfigError at startup naming it. CPU threads are split between the ranks unless --num-threads is
given. A rank process that dies is restarted after 1, 2, 4, ... 30 s (the backoff resets once a
rank has stayed up a minute); meanwhile the gateway marks it down and sends its requests elsewhere.

No rank outlives the launcher. Ranks run in their own process group (a terminal's Ctrl-C reaches
only the launcher, which then stops them once) and get SIGTERM from the kernel if the launcher
dies, even by SIGKILL (process_tree.py). `RankSupervisor.stop()` sends each rank SIGTERM and waits
while it drains (--shutdown-timeout) and flushes L1/L2 to L3 (bounded by the same timeout), and
only then kills a rank that is still there; every rank's exit code is logged as it really was.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_flags import ConfigError
from kvstrata.config_server import RouterConfig, ServerConfig
from kvstrata.kv.event_wire import KVEventsConfig
from kvstrata.router.policy import make_policy
from kvstrata.serving.ports import free_port, port_is_free

logger = logging.getLogger(__name__)

RANK_HOST = "127.0.0.1"
BACKOFF_S = (1.0, 30.0)  # first delay, most
STABLE_S = 60.0  # up this long: the next crash starts the backoff again
EXIT_MARGIN_S = 15.0  # beyond drain + flush: interpreter exit, thread joins
AUTO_EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*",
               "replay_endpoint": "tcp://127.0.0.1:*"}


def _rank_main(
    parent_pid: int, model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig
) -> None:
    import sys

    from kvstrata.process_tree import die_with_parent
    from kvstrata.serving.server import run_server

    os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the launcher only; it stops the ranks once
    die_with_parent(parent_pid)
    sys.exit(run_server(model_cfg, cache_cfg, sched_cfg, server_cfg))  # 1 when the engine died


def rank_ports(n: int, server_cfg: ServerConfig) -> list[int]:
    """--rank-ports (checked: N of them, each free) or N free ports; ConfigError naming a bad one."""
    if server_cfg.port and not port_is_free(server_cfg.host, server_cfg.port):
        raise ConfigError(f"--port {server_cfg.port} on {server_cfg.host} is in use; stop what listens there or pick another")
    if not server_cfg.rank_ports:
        ports: list[int] = []
        while len(ports) < n:
            port = free_port()
            if port not in ports and port != server_cfg.port:
                ports.append(port)
        return ports
    try:
        ports = [int(p) for p in server_cfg.rank_ports.split(",")]
    except ValueError:
        raise ConfigError(f"--rank-ports must be {n} comma-separated port numbers, got {server_cfg.rank_ports!r}") from None
    if len(ports) != n or len(set(ports)) != n:
        raise ConfigError(f"--rank-ports must name {n} different ports (one per rank), got {server_cfg.rank_ports!r}")
    for port in ports:
        if not 0 < port < 65536 or port == server_cfg.port:
            raise ConfigError(f"--rank-ports: {port} is not a port a rank can use")
        if not port_is_free(RANK_HOST, port):
            raise ConfigError(f"--rank-ports: port {port} on {RANK_HOST} is in use; stop what listens there or pick another")
    return ports


@dataclass
class RankSpec:
    rank: int
    configs: tuple[ModelConfig, CacheConfig, SchedulerConfig, ServerConfig]
    process: Any = None  # multiprocessing.Process
    started_at: float = 0.0
    failures: int = 0  # consecutive crashes
    restart_at: float | None = None
    exit_code: int | None = None  # the last exit, as the OS reported it (-N: killed by signal N)

    @property
    def url(self) -> str:
        server_cfg = self.configs[3]
        return f"http://{server_cfg.host}:{server_cfg.port}"


def rank_specs(
    n: int, model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig,
    router_cfg: RouterConfig,
) -> list[RankSpec]:
    events = cache_cfg.kv_events_config
    if not KVEventsConfig.from_json(events).enabled and make_policy(router_cfg).needs_match:  # cache_aware, cost
        events = json.dumps(AUTO_EVENTS)
    threads = model_cfg.num_threads or max(1, (os.cpu_count() or 1) // n)
    return [
        RankSpec(r, (
            replace(model_cfg, num_threads=threads),
            replace(cache_cfg, kv_events_config=events, data_parallel_rank=r),
            sched_cfg,
            replace(server_cfg, host=RANK_HOST, port=port, dp_size=1, rank_ports=""),
        ))
        for r, port in enumerate(rank_ports(n, server_cfg))
    ]


def describe_exit(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class RankSupervisor:
    """Starts the rank processes and restarts any that dies, with backoff, until stop().

    Its own thread starts every rank (the kernel ties a rank's parent-death signal to the thread
    that forked it) and, on stop(), stops them and waits for them before it ends.
    """

    def __init__(self, specs: list[RankSpec], grace_s: float | None = None) -> None:
        self.specs = specs
        shutdown_timeout = specs[0].configs[3].shutdown_timeout if specs else 0.0
        # a rank drains for up to --shutdown-timeout, then flushes L1/L2 -> L3 for up to as long
        self.grace_s = grace_s if grace_s is not None else 2 * shutdown_timeout + EXIT_MARGIN_S
        self._ctx = mp.get_context("spawn")  # no forked torch/threads state in the children
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstrata-rank-supervisor", daemon=True)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.specs]

    def start(self) -> RankSupervisor:
        self._thread.start()
        self._started.wait()
        return self

    def _spawn(self, spec: RankSpec) -> None:
        spec.process = self._ctx.Process(
            target=_rank_main, args=(os.getpid(), *spec.configs), name=f"kvstrata-rank-{spec.rank}", daemon=True
        )
        spec.process.start()
        spec.started_at = time.monotonic()
        spec.restart_at = None
        logger.info("rank_start rank=%d pid=%d url=%s", spec.rank, spec.process.pid, spec.url)

    def _run(self) -> None:
        try:
            for spec in self.specs:
                self._spawn(spec)
        finally:
            self._started.set()
        self._watch()
        self._stop_ranks()

    def _watch(self) -> None:
        while not self._stopping.wait(0.25):
            now = time.monotonic()
            for spec in self.specs:
                if spec.process is None or spec.process.is_alive():
                    continue
                if spec.restart_at is None:
                    spec.exit_code = spec.process.exitcode
                    if now - spec.started_at > STABLE_S:
                        spec.failures = 0
                    delay = min(BACKOFF_S[1], BACKOFF_S[0] * 2**spec.failures)
                    spec.failures += 1
                    spec.restart_at = now + delay
                    logger.warning(
                        "rank_exited rank=%d code=%s (%s) restart_in_s=%.0f", spec.rank, spec.exit_code,
                        describe_exit(spec.exit_code), delay,
                    )
                elif now >= spec.restart_at:
                    self._spawn(spec)

    def _stop_ranks(self) -> None:
        running = [s for s in self.specs if s.process is not None and s.process.is_alive()]
        for spec in running:
            spec.process.terminate()  # SIGTERM: the rank drains, flushes to L3, exits 0
        logger.info("rank_stop_wait ranks=%d grace_s=%.0f", len(running), self.grace_s)
        deadline = time.monotonic() + self.grace_s
        while running and time.monotonic() < deadline:
            running = [s for s in running if s.process.is_alive()]
            if self._forced.wait(0.1):
                self._forced.clear()
                for spec in running:  # a second SIGTERM: the rank stops at once
                    spec.process.terminate()
        for spec in running:
            logger.error("rank_kill rank=%d pid=%d: still running after %.0f s", spec.rank, spec.process.pid, self.grace_s)
            spec.process.kill()
        for spec in self.specs:
            if spec.process is None:
                continue
            spec.process.join()
            if spec.restart_at is None:  # not already reported as an earlier crash
                spec.exit_code = spec.process.exitcode
                level = logging.INFO if spec.exit_code == 0 else logging.ERROR
                logger.log(level, "rank_stopped rank=%d code=%s (%s)", spec.rank, spec.exit_code, describe_exit(spec.exit_code))

    def stop(self) -> int:
        """Stop every rank (drain, flush, exit) and wait; 0 when each one's last exit was clean."""
        self._stopping.set()
        if self._thread.is_alive() or self._started.is_set():
            self._thread.join()
        return 0 if all(s.exit_code in (0, None) for s in self.specs) else 1

    def force(self) -> None:
        """Ask ranks that are draining to stop at once (a second signal to the launcher)."""
        self._forced.set()


def run_data_parallel(
    model_cfg: ModelConfig, cache_cfg: CacheConfig, sched_cfg: SchedulerConfig, server_cfg: ServerConfig,
    router_cfg: RouterConfig,
) -> int:
    """Serve N ranks behind the gateway until SIGTERM/SIGINT (blocking); the exit code: 0 when
    every rank stopped cleanly, 1 otherwise."""
    from kvstrata.router.app import run_gateway

    specs = rank_specs(server_cfg.dp_size, model_cfg, cache_cfg, sched_cfg, server_cfg, router_cfg)
    supervisor = RankSupervisor(specs).start()
    code = 1
    try:
        run_gateway(supervisor.urls, server_cfg, router_cfg, stop_backends=supervisor.stop,
                    force_backends=supervisor.force)
    finally:
        code = supervisor.stop()
        logger.info("launcher_stop exit_code=%d", code)
    return code
