"""Resident memory of a server and every process it started, read from /proc.

A peer may run its model in child processes (vLLM's engine core), so a server's memory is the sum
over the processes of its session (`bench compare` starts each server in a new session): RSS now,
and the sum of each process's own peak (VmHWM), an upper bound of the session's peak when the
processes peaked at different times.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Memory:
    rss_mb: float
    peak_mb: float
    processes: int

    def meta(self) -> dict[str, float | int]:
        """The report fields `bench compare` keeps for a server (MB to one decimal)."""
        return {"rss_mb": round(self.rss_mb, 1), "peak_rss_mb": round(self.peak_mb, 1), "processes": self.processes}


def _field_kb(status: str, name: str) -> int:
    for line in status.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def session_memory(session_id: int) -> Memory:
    """Sum over the live processes whose session id is `session_id` (0 processes where /proc has none)."""
    rss = peak = count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session_id:
                continue
            status = (entry / "status").read_text()
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue  # it exited (or is not ours) between the listing and the read
        rss += _field_kb(status, "VmRSS")
        peak += _field_kb(status, "VmHWM")
        count += 1
    return Memory(rss_mb=rss / 1024, peak_mb=peak / 1024, processes=count)
