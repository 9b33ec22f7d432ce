"""An interrupted `kvstrata bench compare` (SIGTERM, Ctrl-C, even SIGKILL) leaves no server running."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proc_support import alive, descendants, wait_for

DRIVER = str(Path(__file__).resolve().parents[1] / "_compare_driver.py")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_interrupted_compare_stops_the_peer_it_started(tmp_path: Path, tiny_model_dir: Path, sig: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(DRIVER).parent), os.environ.get("PYTHONPATH", "")])}
    # SIGINT as a terminal delivers it: a test run started in the background (`make test &`) inherits
    # SIGINT ignored, and Python keeps an ignored SIGINT ignored
    proc = subprocess.Popen([sys.executable, DRIVER, str(port), str(tmp_path), str(tiny_model_dir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    peers: set[int] = set()
    try:
        wait_for(lambda: _listening(port) or proc.poll() is not None, "the fake peer listening", 300)
        assert proc.poll() is None, proc.stdout.read().decode()
        peers = descendants(proc.pid)
        assert peers, "the peer is a child of compare"
        proc.send_signal(sig)
        out = proc.communicate(timeout=120)[0].decode()
        if sig != signal.SIGKILL:
            assert proc.returncode == 130, out
            assert "interrupted" in out
        wait_for(lambda: not [pid for pid in peers if alive(pid)], "the peer gone")
        assert not _listening(port)
    finally:
        for pid in peers:  # whatever a failed run left behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
