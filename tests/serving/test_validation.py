"""Requests the server must refuse with an OpenAI-style 4xx body; none of these runs a model step."""
from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from serving_support import USER, assert_error

def chat(http: httpx.Client, model: str, **fields: Any) -> httpx.Response:
    body = {"model": model, "messages": USER, "max_tokens": 2, **fields}
    return http.post("/v1/chat/completions", json=body)


def test_invalid_json_is_400(http: httpx.Client) -> None:
    body = b'{"model": "x", "messages": ['
    resp = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert "not valid JSON" in assert_error(resp, 400, code="invalid_json")


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b'"text"'])
def test_body_must_be_an_object(http: httpx.Client, body: bytes) -> None:
    resp = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert_error(resp, 400)


@pytest.mark.parametrize(
    "field, value, param",
    [
        ("max_tokens", "5", "max_tokens"),
        ("max_tokens", 2.5, "max_tokens"),
        ("temperature", "hot", "temperature"),
        ("stream", "yes", "stream"),
        ("n", True, "n"),
        ("stop", 5, "stop"),
        ("stop", ["a", 3], "stop"),
        ("seed", "1", "seed"),
        ("messages", "hi", "messages"),
        ("cache_salt", "", "cache_salt"),
    ],
)
def test_wrong_types_are_400_with_param(
    http: httpx.Client, model_name: str, field: str, value: Any, param: str
) -> None:
    msg = assert_error(chat(http, model_name, **{field: value}), 400, param=param)
    assert msg.startswith(param)


@pytest.mark.parametrize(
    "messages, param",
    [
        ([], "messages"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0]"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], "messages[1].role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content"),
        (["hi"], "messages[0]"),
    ],
)
def test_malformed_messages(http: httpx.Client, model_name: str, messages: list[Any], param: str) -> None:
    assert_error(chat(http, model_name, messages=messages), 400, param=param)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=USER, max_tokens=2)
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"n": 0}, "n"),
        ({"n": 99}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.1}, "frequency_penalty"),
        ({"min_p": -0.1}, "min_p"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),  # json_object and json_schema are honoured
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logit_bias": {"5": 101.0}}, "logit_bias"),
        ({"logit_bias": {"4000000": 1.0}}, "logit_bias"),
        ({"seed": 2**64}, "seed"),
        ({"priority": 2**40}, "priority"),
        ({"priority": 1.5}, "priority"),
    ],
)
def test_bad_values_are_400(client: openai.OpenAI, model_name: str, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=USER, extra_body=fields)
    assert info.value.status_code == 400
    assert info.value.param == param, info.value.body


@pytest.mark.parametrize("raw", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_temperature_is_400(http: httpx.Client, model_name: str, raw: bytes) -> None:
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": %s}'
    body %= (model_name.encode(), raw)
    resp = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert_error(resp, 400, param="temperature")


def test_neutral_values_and_unknown_fields_are_accepted(client: openai.OpenAI, model_name: str) -> None:
    out = client.chat.completions.create(
        model=model_name, messages=USER, max_tokens=1, logprobs=False, presence_penalty=0, frequency_penalty=0,
        response_format={"type": "text"}, user="u1", tool_choice="none",
        extra_body={"some_future_field": {"x": 1}, "echo": None, "priority": -3},
    )
    assert len(out.choices) == 1


def test_prompt_longer_than_context_names_both_numbers(client: openai.OpenAI, engine: Any, model_name: str) -> None:
    limit = engine.max_model_len
    ids = [5] * (limit + 10)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt=ids, max_tokens=1)
    assert str(limit + 10) in info.value.message and str(limit) in info.value.message
    assert info.value.code == "context_length_exceeded"


def test_token_ids_outside_vocab(client: openai.OpenAI, engine: Any, model_name: str) -> None:
    for bad in (engine.vocab_size, -1):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=model_name, prompt=[1, bad], max_tokens=1)
        assert info.value.param == "prompt"


@pytest.mark.parametrize("prompt", ["", [], [[]], [1, "a"], [["a"]], 7, [True, False], None])
def test_malformed_prompts(http: httpx.Client, model_name: str, prompt: Any) -> None:
    resp = http.post("/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 1})
    assert_error(resp, 400, param="prompt")


@pytest.mark.parametrize("fields", [{"suffix": "x"}, {"best_of": 3}])
def test_unsupported_completion_fields(http: httpx.Client, model_name: str, fields: dict[str, Any]) -> None:
    resp = http.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 1, **fields})
    assert_error(resp, 400, param=next(iter(fields)), code="unsupported")


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert "POST /v1/nothing" in assert_error(http.post("/v1/nothing", json={}), 404)
    assert_error(http.get("/v1/chat/completions"), 405)
    resp = http.delete("/v1/models")
    assert_error(resp, 405)
    assert "GET" in resp.headers["allow"]


@pytest.mark.parametrize("rank", [99, 1, -1, True, "0"])
def test_data_parallel_rank_outside_0_of_1_is_400_on_a_single_server(
    http: httpx.Client, model_name: str, rank: Any
) -> None:
    for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "hi"})):
        resp = http.post(path, json={"model": model_name, "max_tokens": 2, "data_parallel_rank": rank, **body})
        assert_error(resp, 400, param="data_parallel_rank")


def test_data_parallel_rank_0_is_this_server(http: httpx.Client, model_name: str) -> None:
    assert chat(http, model_name, data_parallel_rank=0).status_code == 200
