"""Bench fixtures: the real SmolLM2 tokenizer and the OpenAI-style test-double peer."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from _fake_openai_peer import FakePeer, serve_fake_peer


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
    from kvstrata.bench.report import load_tokenizer

    return load_tokenizer(tokenizer_path)
