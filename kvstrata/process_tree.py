"""Child processes that never outlive the process that started them.

`die_with_parent(parent_pid)` runs first thing in a child (a `serve --dp-size N` rank): on Linux
it asks the kernel for SIGTERM when the parent dies (`prctl(PR_SET_PDEATHSIG)`); elsewhere, or
if that call fails, a daemon thread watches `os.getppid()` and sends the same SIGTERM. Either way
the child then drains and exits as on any SIGTERM. A parent that is already gone when the child
starts gets the signal at once.

`pdeathsig_preexec` is the same request as a `subprocess.Popen(preexec_fn=...)` hook, for
servers kvstrata starts as other programs (the peers of `bench compare`); it survives `exec`.

The kernel sends the signal when the *thread* that forked the child ends, so a parent must start
such children from a thread that lives as long as they do (the rank supervisor's own thread).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.5


def _prctl_pdeathsig(sig: int) -> bool:
    """Ask Linux for `sig` when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pdeathsig_preexec() -> None:
    """`preexec_fn` for Popen: the child gets SIGTERM when the thread that started it ends."""
    _prctl_pdeathsig(signal.SIGTERM)


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> str:
    """Make this process receive `sig` once `parent_pid` is no longer its parent; returns how
    ("prctl" or "watch"), for the log."""
    how = "prctl" if _prctl_pdeathsig(sig) else "watch"
    if os.getppid() != parent_pid:  # the parent died before prctl: no signal will come
        logger.warning("parent_gone parent_pid=%d; stopping", parent_pid)
        os.kill(os.getpid(), sig)
        return how
    if how == "watch":

        def watch() -> None:
            while os.getppid() == parent_pid:
                threading.Event().wait(WATCH_INTERVAL_S)
            logger.warning("parent_gone parent_pid=%d; stopping", parent_pid)
            os.kill(os.getpid(), sig)

        threading.Thread(target=watch, name="kvstrata-parent-watch", daemon=True).start()
    return how
