"""Logprobs, echo and penalties over HTTP with the real openai client (serving/logprob_shapes.py): chat's and
completions' shapes, streamed and whole, for every choice of n, equal to transformers' float32 log-softmax
on the same weights; echo's prompt logprobs the same with the prompt cached or not; the response cache
stays out of the way (a stored reply has no logprobs)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from kvstrata.engine.async_engine import AsyncEngine

TOL = 1e-4
PROMPT = [1, 504, 2734, 314, 260, 1345, 1032, 282, 260, 4451, 30, 504, 2734, 314]
USER = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def log_softmax(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        return hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=2)[0, len(ids):].tolist()


def chat_prompt(engine: AsyncEngine) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.apply_chat_template(USER, add_generation_prompt=True))


def test_chat_logprobs_match_transformers_for_every_choice(client: openai.OpenAI, model_name: str,
                                                           engine: AsyncEngine, hf: Any) -> None:
    resp = client.chat.completions.create(model=model_name, messages=USER, max_tokens=6, temperature=0, n=2,
                                          logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    prompt = chat_prompt(engine)
    ids = greedy(hf, prompt, 6)
    lp = log_softmax(hf, prompt + ids)
    text = engine.tokenizer.token_text
    for choice in resp.choices:
        content = choice.logprobs.content
        assert [c.token for c in content] == [text(t) for t in ids]
        for j, (c, t) in enumerate(zip(content, ids)):
            row = lp[len(prompt) - 1 + j]
            assert abs(c.logprob - float(row[t])) <= TOL and c.bytes == list(c.token.encode())
            vals, top = row.topk(3)
            assert [x.token for x in c.top_logprobs] == [text(i) for i in top.tolist()]
            assert all(abs(x.logprob - v) <= TOL for x, v in zip(c.top_logprobs, vals.tolist()))


def test_chat_streamed_logprobs_equal_the_whole_reply(client: openai.OpenAI, model_name: str) -> None:
    kw: dict[str, Any] = dict(model=model_name, messages=USER, max_tokens=8, temperature=0, logprobs=True,
                              top_logprobs=2, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].logprobs.content
    streamed = [c for chunk in client.chat.completions.create(stream=True, **kw) for choice in chunk.choices
                if choice.logprobs is not None for c in choice.logprobs.content or []]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in whole]
    assert len(whole) == 8


def test_chat_without_logprobs_has_none(client: openai.OpenAI, model_name: str) -> None:
    resp = client.chat.completions.create(model=model_name, messages=USER, max_tokens=2, logprobs=False)
    assert resp.choices[0].logprobs is None


def check_completion(hf: Any, choice: Any, prompt: list[int], out_len: int, k: int) -> None:
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt) + out_len
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ids = prompt + greedy(hf, prompt, out_len)
    rows = log_softmax(hf, ids)
    for pos in range(1, len(ids)):
        assert abs(lp.token_logprobs[pos] - float(rows[pos - 1, ids[pos]])) <= TOL, pos
        top = lp.top_logprobs[pos]
        assert lp.tokens[pos] in top and len(top) <= k + 1  # the k best and the chosen token
        assert abs(max(top.values()) - float(rows[pos - 1].max())) <= TOL
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert choice.text.startswith("".join(lp.tokens[: len(prompt)]))  # the echoed prompt, token by token


@pytest.mark.parametrize("cached_first", [False, True])
def test_completion_echo_logprobs_match_transformers(client: openai.OpenAI, model_name: str, hf: Any,
                                                     cached_first: bool) -> None:
    prompt = PROMPT + [4451 + cached_first]  # a prompt of its own per case: cached only when asked
    if cached_first:
        client.completions.create(model=model_name, prompt=prompt, max_tokens=1, temperature=0)
    resp = client.completions.create(model=model_name, prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                     logprobs=2, n=2, extra_body={"ignore_eos": True})
    assert resp.usage.prompt_tokens_details.cached_tokens == 0  # recomputed, never read from the cache
    for choice in resp.choices:
        check_completion(hf, choice, prompt, 3, 2)


def test_completion_logprobs_without_echo(client: openai.OpenAI, model_name: str, hf: Any) -> None:
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0,
                                     extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    ids = greedy(hf, PROMPT, 4)
    rows = log_softmax(hf, PROMPT + ids)
    assert [abs(v - float(rows[len(PROMPT) - 1 + j, t])) <= TOL for j, (v, t) in enumerate(zip(lp.token_logprobs, ids))] \
        == [True] * 4
    assert all(len(top) == 1 for top in lp.top_logprobs)  # logprobs 0: the chosen token alone


def test_streamed_echo_equals_the_whole_reply(client: openai.OpenAI, model_name: str) -> None:
    kw: dict[str, Any] = dict(model=model_name, prompt="The sea is", max_tokens=5, temperature=0, echo=True,
                              logprobs=1, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text and whole.text.startswith("The sea is")
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for c in chunks:
        if c.logprobs is not None:
            for key in joined:
                joined[key].extend(getattr(c.logprobs, key))
    want = {key: getattr(whole.logprobs, key) for key in joined}
    assert joined["tokens"] == want["tokens"] and joined["text_offset"] == want["text_offset"]
    assert [x if x is None else round(x, 4) for x in joined["token_logprobs"]] == \
        [x if x is None else round(x, 4) for x in want["token_logprobs"]], (joined["token_logprobs"], want["token_logprobs"])


def test_echo_without_logprobs_returns_the_prompt_and_no_logprobs(client: openai.OpenAI, model_name: str) -> None:
    choice = client.completions.create(model=model_name, prompt="The sea is", max_tokens=2, echo=True).choices[0]
    assert choice.text.startswith("The sea is") and choice.logprobs is None


def test_logit_bias_and_penalties_reach_the_sampler(client: openai.OpenAI, model_name: str, hf: Any) -> None:
    resp = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=3, temperature=0,
                                     logit_bias={"777": 100}, logprobs=0, extra_body={"ignore_eos": True})
    assert resp.choices[0].logprobs.tokens[0] == client.completions.create(
        model=model_name, prompt=[777], max_tokens=1, echo=True).choices[0].text[:len(resp.choices[0].logprobs.tokens[0])]
    plain = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    penalized = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=12, temperature=0,
                                          frequency_penalty=2, presence_penalty=2,
                                          extra_body={"ignore_eos": True, "repetition_penalty": 1.5}).choices[0].text
    assert penalized != plain  # the random model loops; the penalties break the loop


def test_logprobs_bypass_the_response_cache(http: httpx.Client) -> None:
    body = {"prompt": "The sea", "max_tokens": 2, "temperature": 0, "logprobs": 1}
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 200 and resp.headers["x-kvstrata-cache"] == "bypass"


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"prompt": "x", "min_p": 1.5}, "min_p"),
    ({"prompt": "x", "repetition_penalty": -1}, "repetition_penalty"),
])
def test_bad_values_get_a_400_naming_them(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
