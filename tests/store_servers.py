"""Real L3 servers for tests, each on a free loopback port: redis-server and mooncake_master.

`make test` installs Debian's redis-server (and the libraries the Mooncake wheel needs); nothing has
to be running beforehand. Each context manager yields what a client needs and kills its server;
if the test process dies first (even by SIGKILL), the kernel stops the server (process_tree.py).
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from kvstrata.process_tree import pdeathsig_preexec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}: {out[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


class RedisServer:
    """A redis-server process without persistence; `stop()` kills it (to test a store going down)."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed; `make test` installs it (apt-get install redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--protected-mode", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=pdeathsig_preexec,
        )
        _wait_port(self.port, self.proc, 10.0, "redis-server")

    def stop(self) -> None:
        _stop(self.proc)


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


def mooncake_unavailable() -> str | None:
    """Why the Mooncake backend cannot run here, or None when it can."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return f"mooncake wheel not importable ({exc}); pip install mooncake-transfer-engine-non-cuda"
    if _mooncake_master() is None:
        return "mooncake_master (from the mooncake wheel) is not on PATH nor beside this Python"
    return None


def _mooncake_master() -> str | None:
    beside = Path(sys.executable).parent / "mooncake_master"
    return str(beside) if beside.exists() else shutil.which("mooncake_master")


@contextlib.contextmanager
def mooncake_master() -> Iterator[str]:
    """A mooncake_master on loopback; yields its RPC address "127.0.0.1:port"."""
    exe = _mooncake_master()
    assert exe is not None, mooncake_unavailable()
    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [exe, f"--rpc_port={port}", "--rpc_address=127.0.0.1", f"--metrics_port={metrics_port}",
         "--enable_http_metadata_server=false", "--default_kv_lease_ttl=1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=pdeathsig_preexec,
    )
    try:
        _wait_port(port, proc, 20.0, "mooncake_master")
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)
