"""`kvstrata serve --dp-size 2` as a real command (tiny model): no rank outlives the launcher.

SIGTERM drains and stops every rank (a stream in flight finishes) and the launcher exits 0;
SIGKILL of the launcher makes the ranks exit on their own; a rank killed by a signal is logged
with its real exit code; two launchers run side by side on free rank ports; a port in use fails
at startup naming it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from kvstrata.config_flags import ConfigError
from kvstrata.config_server import ServerConfig
from kvstrata.router.launcher import rank_ports
from kvstrata.serving.ports import free_port
from proc_support import KvstrataProcess, alive, descendants, wait_for


Launch = Callable[..., tuple[KvstrataProcess, str]]


def _args(model: Path, port: int, *extra: str) -> list[str]:
    return ["serve", "--dp-size", "2", "--model", str(model), "--dtype", "float32", "--port", str(port),
            "--num-threads", "1", "--max-total-tokens", "4096", "--max-model-len", "2048", "--shutdown-timeout", "20",
            "--health-check-interval", "0.2", *extra]


@pytest.fixture()
def launch(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Launch]:
    started: list[KvstrataProcess] = []

    def start(*extra: str) -> tuple[KvstrataProcess, str]:
        port = free_port()
        proc = KvstrataProcess(_args(tiny_model_dir, port, *extra), tmp_path / f"launcher-{port}.log")
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        proc.wait_healthy(url, ranks=2)
        return proc, url

    try:
        yield start
    finally:
        for proc in started:
            tree = descendants(proc.proc.pid)
            proc.close()
            for pid in tree:  # whatever a failed test left behind
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def _rank_pids(proc: KvstrataProcess) -> dict[int, int]:
    found = dict(re.findall(r"rank_start rank=(\d+) pid=(\d+)", proc.text()))
    return {int(r): int(p) for r, p in found.items()}


def test_sigterm_drains_stops_every_rank_and_reports_real_exit_codes(launch: Launch) -> None:
    proc, url = launch()
    first = _rank_pids(proc)
    os.kill(first[1], signal.SIGKILL)  # an engine death is reported as such, then the rank comes back
    wait_for(lambda: "rank_exited rank=1 code=-9 (killed by SIGKILL)" in proc.text(), "rank 1's death logged")
    wait_for(lambda: len(re.findall(r"rank_start rank=1 ", proc.text())) == 2, "rank 1 restarted")
    proc.wait_healthy(url, ranks=2)
    tree = descendants(proc.proc.pid)
    ranks = set(_rank_pids(proc).values())
    assert ranks <= tree and len(ranks) == 2
    body = {"messages": [{"role": "user", "content": "count"}], "max_tokens": 300, "ignore_eos": True,
            "temperature": 0, "stream": True, "data_parallel_rank": 0}
    chunks = []
    with httpx.Client(timeout=120) as http, http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not chunks:
                proc.proc.send_signal(signal.SIGTERM)  # mid-stream
                wait_for(lambda: "gateway_shutdown_signal" in proc.text(), "the launcher saw SIGTERM")
                refused = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False}, timeout=30)
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
            chunks.append(line)
    finals = [json.loads(c[6:]) for c in chunks if c.startswith("data: {")]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"  # the stream in flight ran to its end
    assert [c for c in chunks if c][-1] == "data: [DONE]"
    assert wait_for(lambda: proc.proc.poll() is not None, "launcher exit") is not None
    assert proc.proc.returncode == 0  # every rank's last run ended cleanly (the crash is logged above)
    log = proc.text()
    assert "rank_stopped rank=0 code=0 (exit code 0)" in log and "rank_stopped rank=1 code=0 (exit code 0)" in log
    assert "rank_kill" not in log
    # a rank's own helper processes exit just after it (they get its SIGTERM too): poll, then name any left
    wait_for(lambda: not [pid for pid in tree if alive(pid)], "every descendant gone", timeout_s=30.0)
    assert not [pid for pid in tree if alive(pid)], log[-3000:]


def test_two_launchers_side_by_side_then_ctrl_c_one_and_sigkill_the_other(launch: Launch) -> None:
    (a, url_a), (b, url_b) = launch(), launch()
    ranks_a = {r["url"] for r in httpx.get(url_a + "/health").json()["ranks"]}
    ranks_b = {r["url"] for r in httpx.get(url_b + "/health").json()["ranks"]}
    assert len(ranks_a | ranks_b) == 4  # four different rank ports
    for rank_url in ranks_a | ranks_b:
        assert f"url={rank_url}" in a.text() + b.text()  # each rank's port is in its launcher's log
    for url in (url_a, url_b):
        resp = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)
        assert resp.status_code == 200
    tree_a, tree_b = descendants(a.proc.pid), descendants(b.proc.pid)
    assert set(_rank_pids(a).values()) <= tree_a and set(_rank_pids(b).values()) <= tree_b
    a.proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
    b.proc.kill()  # SIGKILL: the ranks must notice on their own
    wait_for(lambda: a.proc.poll() is not None, "launcher A exit")
    assert a.proc.returncode == 0, a.text()[-3000:]
    b.proc.wait()
    wait_for(lambda: not [pid for pid in tree_a | tree_b if alive(pid)], "every rank of A and B gone")


def test_a_port_in_use_fails_at_startup_naming_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for extra in ([], ["--rank-ports", f"{free_port()},{port}"]):
            gateway_port = port if not extra else free_port()
            proc = KvstrataProcess(_args(tiny_model_dir, gateway_port, *extra), tmp_path / "busy.log")
            assert proc.proc.wait(timeout=120) == 2
            assert f"{port}" in proc.text() and "is in use" in proc.text(), proc.text()
            proc.close()


@pytest.mark.parametrize("ports, needle", [
    ("1,2,3", "must name 2 different ports"), ("5,5", "must name 2 different ports"), ("a,b", "comma-separated"),
    ("0,70000", "is not a port"),
])
def test_bad_rank_ports_are_config_errors(ports: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        rank_ports(2, ServerConfig(port=free_port(), rank_ports=ports))


def test_rank_ports_default_to_distinct_free_ports() -> None:
    cfg = ServerConfig(port=free_port())
    ports = rank_ports(3, cfg)
    assert len(set(ports)) == 3 and cfg.port not in ports
    assert rank_ports(2, ServerConfig(port=free_port(), rank_ports=f"{ports[0]},{ports[1]}")) == ports[:2]
