"""POST /v1/completions and GET /v1/models against the real engine."""
from __future__ import annotations

from typing import Any

import openai
import pytest

from kvstrata.engine.async_engine import AsyncEngine

PROMPT = "Once upon a time"


def complete(client: openai.OpenAI, model: str, prompt: Any, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 6)
    return client.completions.create(model=model, prompt=prompt, temperature=0, extra_body={"ignore_eos": True}, **kw)


def test_all_prompt_forms_agree(client: openai.OpenAI, engine: AsyncEngine, model_name: str) -> None:
    ids = engine.tokenizer.encode(PROMPT)
    outs = [complete(client, model_name, p) for p in (PROMPT, [PROMPT], ids, [ids])]
    assert len({o.choices[0].text for o in outs}) == 1
    for out in outs:
        assert out.id.startswith("cmpl-") and out.object == "text_completion"
        assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 6
        assert out.usage.total_tokens == len(ids) + 6
        assert out.choices[0].finish_reason == "length"


def test_batch_of_prompts_with_n(client: openai.OpenAI, engine: AsyncEngine, model_name: str) -> None:
    prompts = [PROMPT, "In a galaxy far away"]
    out = complete(client, model_name, prompts, n=2, max_tokens=4)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    alone = [complete(client, model_name, p, max_tokens=4).choices[0].text for p in prompts]
    assert [c.text for c in out.choices] == [alone[0], alone[0], alone[1], alone[1]]  # greedy: choices agree
    assert out.usage.prompt_tokens == sum(len(engine.tokenizer.encode(p)) for p in prompts)
    assert out.usage.completion_tokens == 16


def test_default_max_tokens_is_16(client: openai.OpenAI, model_name: str) -> None:
    out = client.completions.create(model=model_name, prompt=PROMPT, extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == 16


def test_repeated_prompt_is_served_from_the_prefix_cache(client: openai.OpenAI, model_name: str) -> None:
    ids = list(range(3000, 3100))
    first = complete(client, model_name, ids, max_tokens=1)
    again = complete(client, model_name, ids, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 80 <= again.usage.prompt_tokens_details.cached_tokens < 100
    assert again.choices[0].text == first.choices[0].text


def test_models_lists_the_served_model(client: openai.OpenAI, engine: AsyncEngine, model_name: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert models.data[0].model_extra == {"max_model_len": engine.max_model_len}
    assert client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")

