"""A server's memory summed over its session's processes (kvstrata/bench/proc_memory.py)."""
from __future__ import annotations

import subprocess
import sys
import time

from kvstrata.bench.proc_memory import session_memory

HOLD = """
import sys, time, subprocess
block = bytearray(120 * 2**20)  # touched: resident
child = subprocess.Popen([sys.executable, "-c", "b = bytearray(80 * 2**20); import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


def test_memory_sums_a_server_and_its_children() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while (mem := session_memory(proc.pid)).processes < 2 or mem.rss_mb < 200:
            assert time.monotonic() < deadline, mem
            time.sleep(0.1)
        assert mem.processes == 2
        assert 200 <= mem.rss_mb <= mem.peak_mb
    finally:
        proc.kill()
        subprocess.run(["pkill", "-s", str(proc.pid)], check=False)
        proc.wait()


def test_a_session_with_no_process_is_empty() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    assert session_memory(proc.pid).processes == 0
