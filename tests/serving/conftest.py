"""Serving fixtures: the real engine, the real uvicorn server on a free port, the real openai client.

`make_engine` is the one place the serving tests build an engine; every other fixture and test
gets its engine from it (the session `engine`, or a fresh one for tests that kill it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import httpx
import openai
import pytest

from kvstrata.config import ModelConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.server import ServerThread
from serving_support import CACHE, MAX_MODEL_LEN, SCHED, make_state, openai_client, serve


@pytest.fixture(scope="session")
def model_cfg(tiny_model_dir: Path) -> ModelConfig:
    return ModelConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="session")
def make_engine(model_cfg: ModelConfig) -> Callable[[], AsyncEngine]:
    """Build a real engine (a tiny random-weight Llama with SmolLM2's tokenizer, about 0.3 s)."""
    return lambda: AsyncEngine.from_config(model_cfg, CACHE, SCHED)


@pytest.fixture(scope="session")
def engine(make_engine: Callable[[], AsyncEngine]) -> Iterator[AsyncEngine]:
    eng = make_engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def thinking_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model with a chat template that thinks (thinking_model.py's THINKING_TEMPLATE)."""
    from thinking_model import write_thinking_model

    return write_thinking_model(tiny_model_dir, tmp_path_factory.mktemp("thinking") / "model")


@pytest.fixture(scope="session")
def thinking_engine(thinking_model_dir: Path) -> Iterator[AsyncEngine]:
    eng = AsyncEngine.from_config(
        ModelConfig(model=str(thinking_model_dir), dtype="float32", max_model_len=MAX_MODEL_LEN), CACHE, SCHED)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def server(engine: AsyncEngine) -> Iterator[ServerThread]:
    with serve(make_state(engine)) as srv:
        yield srv


@pytest.fixture(scope="session")
def model_name(engine: AsyncEngine) -> str:
    return engine.served_model_name


@pytest.fixture()
def client(server: ServerThread) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture()
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c
