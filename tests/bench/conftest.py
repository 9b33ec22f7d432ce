"""Bench fixtures: the real SmolLM2 tokenizer, the OpenAI-style test-double peer, and a real kvstrata server on
the tiny random-weight model."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from _fake_openai_peer import FakePeer, serve_fake_peer
from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.server import ServerThread
from kvstrata.serving.state import ServerState

TINY_SERVER_MAX_MODEL_LEN = 1024


@pytest.fixture(scope="session")
def fake_peer() -> Iterator[FakePeer]:
    with serve_fake_peer() as peer:
        yield peer


@pytest.fixture(scope="session")
def tokenizer_path(smollm2_path: Path) -> str:
    """The SmolLM2 GGUF, fetched on first use (tests/conftest.py), as `--tokenizer` takes it."""
    return str(smollm2_path)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path: str) -> Any:
    from kvstrata.bench.achievable import load_tokenizer

    return load_tokenizer(tokenizer_path)


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir: Path) -> Iterator[ServerThread]:
    """A real kvstrata server (uvicorn on a free port) on the tiny model: float32, context 1024, pages of 16."""
    model = ModelConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=TINY_SERVER_MAX_MODEL_LEN)
    cache = CacheConfig(max_total_tokens=4096, page_size=16)
    engine = AsyncEngine.from_config(model, cache, SchedulerConfig())
    state = ServerState(model, cache, SchedulerConfig(), ServerConfig(port=0))
    state.publish(engine)
    srv = ServerThread(state).start()
    try:
        yield srv
    finally:
        srv.stop()
        engine.shutdown()
