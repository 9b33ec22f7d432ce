"""Bench fixtures: the real SmolLM2 tokenizer and the OpenAI-style test-double peer."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from _fake_openai_peer import FakePeer, serve_fake_peer
from kvstrata.bench.args import default_tokenizer


@pytest.fixture(scope="session")
def fake_peer() -> Iterator[FakePeer]:
    with serve_fake_peer() as peer:
        yield peer


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    path = default_tokenizer()
    if not Path(path).is_file():
        pytest.fail(f"the SmolLM2 GGUF is missing at {path}: run `kvstrata fetch-model smollm2`")
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path: str) -> Any:
    from kvstrata.bench.report import load_tokenizer

    return load_tokenizer(tokenizer_path)
