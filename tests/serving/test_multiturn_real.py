"""The real SmolLM2 behind the real server, driven by the real openai client through a multi-turn
conversation: each turn's cached_tokens covers the previous turn's prompt and reply."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import openai
import pytest

from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving.server import ServerThread
from serving_support import make_state, openai_client, serve

pytestmark = pytest.mark.slow
PAGE = 16


@pytest.fixture(scope="module")
def real_server(smollm2_path: Path) -> Iterator[ServerThread]:
    engine = AsyncEngine.from_config(
        ModelConfig(model=str(smollm2_path), served_model_name="smollm2"),  # served defaults (bf16)
        CacheConfig(max_total_tokens=8192, page_size=PAGE),
        SchedulerConfig(),
    )
    try:
        with serve(make_state(engine)) as srv:
            yield srv
    finally:
        engine.shutdown()


def test_turns_hit_previous_prompt_and_reply(real_server: ServerThread) -> None:
    client = openai_client(real_server, timeout=120)
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    prev_total = 0
    for k, question in enumerate(["What is a prime number?", "Give an example.", "And a larger one?"]):
        messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0)
        cached = r.usage.prompt_tokens_details.cached_tokens
        if k == 0:
            assert cached == 0
        else:
            assert cached >= prev_total // PAGE * PAGE - PAGE, (k, cached, prev_total)
        assert cached < r.usage.prompt_tokens
        prev_total = r.usage.prompt_tokens + r.usage.completion_tokens
        messages.append({"role": "assistant", "content": r.choices[0].message.content})


def test_real_model_answers_sensibly(real_server: ServerThread) -> None:
    """Capitals the 135M model knows, asked greedily. One of them may sit on a near tie that bf16 and float32
    break differently (float32 misses Italy, bf16 on AMX row-group attention misses France: docs/cpu-kernels.md),
    so three of four must be right; a broken model path gets none."""
    client = openai_client(real_server, timeout=120)
    right = 0
    for country, city in [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Japan", "Tokyo")]:
        r = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": f"What is the capital of {country}?"}],
            max_tokens=16, temperature=0,
        )
        right += city in (r.choices[0].message.content or "")
        assert r.choices[0].finish_reason in ("stop", "length")
    assert right >= 3, right
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
