"""MooncakeStore: L3 in a Mooncake Store cluster (the `mooncake-transfer-engine` wheels).

`setup` joins the cluster through `mooncake_master` (`master_server_address`, host:port) with
`metadata_server="P2PHANDSHAKE"` (no metadata service) over `protocol="tcp"` unless RDMA is asked for;
this client also lends `global_segment_size` bytes of its own memory to the cluster.

Objects are never removed or overwritten here: the master leases an object for about 10 s after a
read, and a remove or upsert during the lease fails (OBJECT_HAS_LEASE). Keys are content addresses,
so an existing key already holds the right value: puts skip keys that exist, and a put that fails
because another writer got there first is not an error. Old pages go by the master's eviction.
"""
from __future__ import annotations

import logging
from typing import Any

from kvstrata.kv.store.base import StoreUnavailableError, leading_run

logger = logging.getLogger(__name__)


class MooncakeStore:
    def __init__(
        self,
        master_server_address: str = "127.0.0.1:50051",
        metadata_server: str = "P2PHANDSHAKE",
        protocol: str = "tcp",
        global_segment_size: int = 512 * 2**20,
        local_buffer_size: int = 256 * 2**20,
        local_hostname: str = "127.0.0.1",
        device_name: str = "",
    ) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore  # heavy optional import
        except ImportError as exc:
            raise StoreUnavailableError(
                f"the mooncake backend needs `pip install mooncake-transfer-engine-non-cuda` (CPU) or "
                f"`mooncake-transfer-engine` (CUDA), plus Debian's libibverbs1 librdmacm1 libnuma1 "
                f"liburing2 libcurl4: {exc}"
            ) from exc
        self._s: Any = MooncakeDistributedStore()
        rc = self._s.setup(
            local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol, device_name,
            master_server_address,
        )
        if rc != 0:
            raise StoreUnavailableError(
                f"mooncake setup failed (rc={rc}); is mooncake_master listening on {master_server_address}?"
            )

    def batch_exists(self, keys: list[str]) -> int:
        return leading_run(self._s.batch_is_exist(keys)) if keys else 0

    def batch_get(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        return [v if v else None for v in self._s.get_batch(keys)]

    def batch_put(self, keys: list[str], values: list[bytes], ttl_s: float | None = None) -> None:  # no lifetime
        if not keys:
            return
        exists = self._s.batch_is_exist(keys)
        todo = [(k, v) for k, v, e in zip(keys, values, exists, strict=True) if e != 1]
        if not todo:
            return
        rc = self._s.put_batch([k for k, _ in todo], [v for _, v in todo])
        if rc != 0:  # find out which failed: a key another writer stored meanwhile is fine
            failed = [k for k, v in todo if self._s.put(k, v) != 0 and self._s.is_exist(k) != 1]
            if failed:
                raise RuntimeError(f"mooncake put failed for {len(failed)} of {len(todo)} keys (rc={rc})")

    def close(self) -> None:
        self._s.close()
