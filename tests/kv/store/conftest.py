"""Every L3 backend as a fixture, each against a real server on a free loopback port."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from store_servers import mooncake_master, mooncake_unavailable, redis_server

from kvstrata.kv.store import KVStore, create_store

BACKENDS = ["file", "redis", "mooncake"]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_server() as server:
        yield server.url


@pytest.fixture(scope="session")
def mooncake_address() -> Iterator[str]:
    reason = mooncake_unavailable()
    if reason:
        pytest.skip(reason)
    with mooncake_master() as address:
        yield address


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    name = request.param
    if name == "file":
        s = create_store("file", {"path": str(tmp_path / "kvstore")})
    elif name == "redis":
        s = create_store("redis", {"url": request.getfixturevalue("redis_url")})
    else:
        s = create_store("mooncake", {"master_server_address": request.getfixturevalue("mooncake_address"),
                                      "global_segment_size": 64 * 2**20, "local_buffer_size": 64 * 2**20})
    yield s
    s.close()
