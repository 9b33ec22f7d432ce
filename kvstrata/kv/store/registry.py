"""L3 backends by name: `create_store("redis", {"url": ...})`.

A registry entry is "module:Class" (imported only when that backend is chosen, so `redis` and
`mooncake` are needed only by those who choose them) or any callable taking the extra config as
keyword arguments. Tests and plugins add names with `register_store`.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from kvstrata.kv.store.base import KVStore

StoreFactory = Callable[..., KVStore]

STORE_FACTORIES: dict[str, str | StoreFactory] = {
    "file": "kvstrata.kv.store.file_store:FileStore",
    "redis": "kvstrata.kv.store.redis_store:RedisStore",
    "mooncake": "kvstrata.kv.store.mooncake_store:MooncakeStore",
}


def register_store(name: str, factory: StoreFactory) -> None:
    STORE_FACTORIES[name] = factory


def create_store(name: str, config: dict[str, Any] | None = None) -> KVStore:
    """A backend from its name and its extra config (the parsed `--kvstore-storage-backend-extra-config`)."""
    entry = STORE_FACTORIES.get(name)
    if entry is None:
        raise ValueError(f"unknown --kvstore-storage-backend {name!r}; choose one of {sorted(STORE_FACTORIES)}")
    if isinstance(entry, str):
        module, attr = entry.split(":")
        entry = getattr(importlib.import_module(module), attr)
    config = dict(config or {})
    params = inspect.signature(entry).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(config) - set(params))
    if unknown and not takes_any:
        raise ValueError(
            f"--kvstore-storage-backend-extra-config has {unknown}, which the {name} backend does not take; "
            f"it takes {sorted(params)}"
        )
    return entry(**config)
