"""Waiting in tests on a polled condition, never on a sleep of a guessed length."""
from __future__ import annotations

import time
from typing import Callable


def wait_for(cond: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.01) -> bool:
    """Poll `cond` until it holds (True) or `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True
