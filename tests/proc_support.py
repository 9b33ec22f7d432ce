"""Test helpers for process trees: who descends from a pid (read from /proc), who is still alive,
and `kvstrata serve` started as a real command (`KvstrataProcess`)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx


def _ppids() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...)."""
    ppids = _ppids()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in ppids.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has stopped: it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 600.0) -> Any:
    """Poll `condition` until it is truthy; the timeout only keeps a broken run from hanging."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not true after {timeout_s:.0f} s: {what}")


class KvstrataProcess:
    """`python -m kvstrata.cli ARGS` in the background, its output in a log file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "kvstrata.cli", *args], stdout=self._out,
                                     stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def text(self) -> str:
        return self.log.read_text()

    def wait_healthy(self, url: str, ranks: int = 0) -> dict[str, Any]:
        """Until GET url/health says ready (and, for a gateway, `ranks` ranks ready)."""

        def ready() -> dict[str, Any] | None:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.text()[-3000:]}"
            try:
                resp = httpx.get(url + "/health", timeout=5)
            except httpx.HTTPError:
                return None
            body = resp.json()
            if resp.status_code != 200 or sum(r["status"] == "ready" for r in body.get("ranks", [])) < ranks:
                return None
            return body

        return wait_for(ready, f"{url} healthy")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._out.close()
