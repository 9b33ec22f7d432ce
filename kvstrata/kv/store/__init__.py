"""L3 stores: the `KVStore` protocol, its backends (file, redis, mooncake) and their registry."""
from __future__ import annotations

from kvstrata.kv.store.base import KVStore, StoreTimeoutError, StoreUnavailableError
from kvstrata.kv.store.guard import GuardedStore
from kvstrata.kv.store.registry import STORE_FACTORIES, create_store, register_store

__all__ = [
    "KVStore", "StoreUnavailableError", "StoreTimeoutError", "GuardedStore", "STORE_FACTORIES", "create_store",
    "register_store",
]
