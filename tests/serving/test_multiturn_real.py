"""The real SmolLM2 behind the real server, driven by the real openai client through a multi-turn
conversation: each turn's cached_tokens covers the previous turn's prompt and reply."""
from __future__ import annotations

import time
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


def test_next_turn_opener_prefilled_after_a_reply(real_server: ServerThread) -> None:
    """A reply that ends on <|im_end|> is followed, before the next request, by a prefill of that token and
    the template's `\\n<|im_start|>user\\n` (engine/next_turn.py): the next turn reads all of its prompt but
    its own new message from the cache."""
    client = openai_client(real_server, timeout=120)
    engine = real_server.state.ready_engine().engine
    tok = real_server.state.ready_engine().tokenizer
    messages = [{"role": "system", "content": "Answer in a few words."},
                {"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=48, temperature=0)
    assert r.choices[0].finish_reason == "stop"
    deadline = time.monotonic() + 30
    while engine.has_unfinished() and time.monotonic() < deadline:  # the follow-up runs after the reply went out
        time.sleep(0.02)
    question = "And of Italy?"
    messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": question}]
    r2 = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4, temperature=0)
    # new: the question and the closing `<|im_end|>\n<|im_start|>assistant\n`; before the follow-up the
    # sampled `<|im_end|>` and the opener `\n<|im_start|>user\n` were new as well
    new = len(tok.encode(question + "<|im_end|>\n<|im_start|>assistant\n"))
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - new
