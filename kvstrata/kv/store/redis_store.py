"""RedisStore: L3 in a Redis server (redis-py), shared by every rank and machine that reaches it.

One pipelined round trip per batch: EXISTS per key (to find the leading run), MGET, SET. Values may
expire (`ttl_s`, or a retained prompt's own lifetime given to batch_put) or be evicted by Redis' own maxmemory policy; either is just a miss. Short socket
timeouts and no retries keep a dead server from holding an I/O thread for long.
"""
from __future__ import annotations

from typing import Any

from kvstrata.kv.store.base import leading_run


class RedisStore:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        prefix: str = "kvstrata:page:",
        ttl_s: int | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        import redis  # heavy optional import: only when this backend is chosen
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.prefix = prefix
        self.ttl_s = ttl_s
        self._r: Any = redis.Redis.from_url(  # no retries: GuardedStore backs off instead
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )

    def batch_exists(self, keys: list[str]) -> int:
        pipe = self._r.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self.prefix + key)
        return leading_run(pipe.execute())

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        return list(self._r.mget([self.prefix + k for k in keys]))

    def batch_put(self, keys: list[str], values: list[bytes], ttl_s: float | None = None) -> None:
        """`ttl_s` (a retained prompt's lifetime) wins over the store's `ttl_s`: SET PX."""
        pipe = self._r.pipeline(transaction=False)
        px = max(1, int(ttl_s * 1000)) if ttl_s is not None else None
        for key, value in zip(keys, values, strict=True):
            if px is not None:
                pipe.set(self.prefix + key, value, px=px)
            else:
                pipe.set(self.prefix + key, value, ex=self.ttl_s)
        pipe.execute()

    def close(self) -> None:
        self._r.close()
