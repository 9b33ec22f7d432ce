"""SingleFlight: at most as many generations per key as the key still needs; other misses wait.

Concurrent identical misses would each run the model; instead a miss calls `try_start(key,
needed)`: it leads (runs the model) while fewer than `needed` generations of that key are running,
otherwise it awaits `wait(key)`, which returns when any generation of the key ends, and then looks
the key up again (it is a hit now, or it leads the next try if the generation failed). Every
`try_start` that returned True must be paired with exactly one `end(key)`.

Lives on the event loop's thread (the HTTP routes); no locks.
"""
from __future__ import annotations

import asyncio


class SingleFlight:
    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._ended: dict[str, asyncio.Event] = {}

    def running(self, key: str) -> int:
        return self._running.get(key, 0)

    def try_start(self, key: str, needed: int) -> bool:
        """Lead one generation of `key` if fewer than `needed` (at least 1) are running."""
        running = self._running.get(key, 0)
        if running >= max(1, needed):
            return False
        self._running[key] = running + 1
        return True

    async def wait(self, key: str) -> None:
        """Return when a generation of `key` ends (at once if none is running)."""
        if not self._running.get(key):
            return
        event = self._ended.get(key)
        if event is None:
            event = self._ended[key] = asyncio.Event()
        await event.wait()

    def end(self, key: str) -> None:
        """A generation of `key` ended (added to the cache, failed or aborted): wake its waiters."""
        running = self._running.get(key, 0) - 1
        if running < 0:
            raise RuntimeError(f"SingleFlight.end({key!r}) without a matching try_start")
        if running:
            self._running[key] = running
        else:
            del self._running[key]
        event = self._ended.pop(key, None)
        if event is not None:
            event.set()
