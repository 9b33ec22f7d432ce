"""/tokenize and /detokenize on the real server (tiny model, SmolLM2's tokenizer): the engine tokenizer's
ids, the chat route's prompt count, a round trip, and a 4xx naming the field for each bad input."""
from __future__ import annotations

import threading
from typing import Any, Callable

import httpx
import openai
import pytest

from kvstrata.config_server import ServerConfig
from kvstrata.engine.async_engine import AsyncEngine
from kvstrata.serving import tokenize_api
from serving_support import MAX_MODEL_LEN, USER, assert_error, make_state, serve

LOOP_THREAD = "kvstrata-uvicorn"  # ServerThread's: the event loop's thread
PROMPT = "The quick brown fox jumps over the lazy dog, 3 times!"
CHAT = [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Capital of France?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}]


def tokenize(http: httpx.Client, **body: Any) -> dict[str, Any]:
    resp = http.post("/tokenize", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_prompt_gets_the_engine_tokenizers_ids(http: httpx.Client, engine: AsyncEngine) -> None:
    body = tokenize(http, prompt=PROMPT)
    assert body == {"count": len(body["tokens"]), "max_model_len": engine.max_model_len,
                    "tokens": engine.tokenizer.encode(PROMPT, add_special_tokens=True)}
    assert body["count"] > 5 and body["max_model_len"] == MAX_MODEL_LEN
    plain = tokenize(http, prompt=PROMPT, add_special_tokens=False, model=engine.served_model_name)
    assert plain["tokens"] == engine.tokenizer.encode(PROMPT)
    assert tokenize(http, prompt="") == {"count": 0, "max_model_len": MAX_MODEL_LEN, "tokens": []}


def test_token_strs_are_the_vocabularys_pieces(http: httpx.Client) -> None:
    body = tokenize(http, prompt="hello world", return_token_strs=True)
    assert body["token_strs"] == ["hello", "Ġworld"] and body["count"] == 2
    assert "token_strs" not in tokenize(http, prompt="hello world", return_token_strs=False)


def test_detokenize_of_tokenize_is_the_prompt(http: httpx.Client) -> None:
    ids = tokenize(http, prompt=PROMPT)["tokens"]
    resp = http.post("/detokenize", json={"tokens": ids})
    assert resp.status_code == 200 and resp.json() == {"prompt": PROMPT}
    assert http.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["plain", "tools"])
def test_a_chats_count_is_the_chat_routes_prompt_tokens(http: httpx.Client, client: openai.OpenAI, model_name: str,
                                                        tools: list[dict[str, Any]] | None) -> None:
    extra = {"tools": tools} if tools else {}
    body = tokenize(http, messages=CHAT, **extra)
    reply = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                           **extra)
    assert reply.usage is not None and body["count"] == reply.usage.prompt_tokens
    if tools:  # the tool is in the rendered prompt
        assert body["count"] > tokenize(http, messages=CHAT)["count"]


def test_a_chat_renders_as_the_template_writes_it(http: httpx.Client, engine: AsyncEngine) -> None:
    opened = tokenize(http, messages=CHAT)
    closed = tokenize(http, messages=CHAT, add_generation_prompt=False)
    assert closed["count"] < opened["count"] and opened["tokens"][:closed["count"]] == closed["tokens"]
    text = engine.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert "<|im_start|>" in text  # special tokens are written out, not dropped
    assert http.post("/detokenize", json={"tokens": opened["tokens"]}).json() == {"prompt": text}


LONG = "hello " * (MAX_MODEL_LEN + 10)
BAD_TOKENIZE: list[tuple[str, dict[str, Any], int, str | None, str | None]] = [
    ("another model", {"prompt": "x", "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("neither", {"add_special_tokens": True}, 400, "prompt", None),
    ("both", {"prompt": "x", "messages": USER}, 400, "messages", None),
    ("prompt a number", {"prompt": 5}, 400, "prompt", None),
    ("prompt a list of ids", {"prompt": [1, 2]}, 400, "prompt", None),
    ("add_special_tokens a string", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens", None),
    ("return_token_strs a number", {"prompt": "x", "return_token_strs": 1}, 400, "return_token_strs", None),
    ("model a number", {"prompt": "x", "model": 5}, 400, "model", None),
    ("no messages", {"messages": []}, 400, "messages", None),
    ("a message a string", {"messages": ["hi"]}, 400, "messages[0]", None),
    ("a bad role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    ("a tool without a function", {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools", None),
    ("a template arg the request owns", {"messages": USER, "chat_template_kwargs": {"tools": []}}, 400,
     "chat_template_kwargs", None),
    ("continue_final_message", {"messages": USER, "continue_final_message": True}, 400, "continue_final_message",
     "unsupported"),
    ("a chat_template", {"messages": USER, "chat_template": "{{ messages }}"}, 400, "chat_template", "unsupported"),
]


def test_texts_longer_than_the_context_are_counted(http: httpx.Client, engine: AsyncEngine) -> None:
    """No context check, as vLLM: a text is tokenized to be counted or cut into windows."""
    body = http.post("/tokenize", json={"prompt": LONG}).json()
    assert body["count"] > body["max_model_len"] and body["tokens"] == engine.tokenizer.encode(LONG)
    back = http.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back["prompt"] == LONG


@pytest.mark.parametrize("name, body, status, param, code", BAD_TOKENIZE, ids=[b[0] for b in BAD_TOKENIZE])
def test_bad_tokenize_gets_an_error_naming_the_field(http: httpx.Client, name: str, body: dict[str, Any], status: int,
                                                     param: str | None, code: str | None) -> None:
    assert_error(http.post("/tokenize", json=body), status, param, code)


BAD_DETOKENIZE: list[tuple[str, Any, int, str | None, str | None]] = [
    ("another model", {"tokens": [1], "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("no tokens", {}, 400, "tokens", None),
    ("tokens a string", {"tokens": "hello"}, 400, "tokens", None),
    ("a float id", {"tokens": [1, 2.5]}, 400, "tokens[1]", None),
    ("a string id", {"tokens": ["1"]}, 400, "tokens[0]", None),
    ("an id past the vocabulary", {"tokens": [1, 10**12]}, 400, "tokens", None),
    ("a negative id", {"tokens": [-1]}, 400, "tokens", None),
    ("a body not an object", [1, 2], 400, None, None),
]


@pytest.mark.parametrize("name, body, status, param, code", BAD_DETOKENIZE, ids=[b[0] for b in BAD_DETOKENIZE])
def test_bad_detokenize_gets_an_error_naming_the_field(http: httpx.Client, name: str, body: Any, status: int,
                                                       param: str | None, code: str | None) -> None:
    assert_error(http.post("/detokenize", json=body), status, param, code)


def test_the_vocabulary_ends_at_the_tokenizers_last_id(http: httpx.Client, engine: AsyncEngine) -> None:
    last = engine.tokenizer.vocab_size - 1
    assert http.post("/detokenize", json={"tokens": [last]}).status_code == 200
    msg = assert_error(http.post("/detokenize", json={"tokens": [last + 1]}), 400, "tokens")
    assert str(last + 1) in msg


def test_a_key_is_needed_when_keys_are_set(engine: AsyncEngine) -> None:
    with serve(make_state(engine, ServerConfig(port=0, api_key=("sk-k",), metrics_public=True))) as srv, \
            httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            assert_error(http.post(path, json=body), 401, code="invalid_api_key")
            assert_error(http.post(path, json=body, headers={"Authorization": "Bearer sk-wrong"}), 401)
            assert http.post(path, json=body, headers={"Authorization": "Bearer sk-k"}).status_code == 200


def test_a_loading_server_answers_503() -> None:
    with serve(make_state(None)) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:
        assert_error(http.post("/tokenize", json={"prompt": "x"}), 503, code="model_loading")
        assert_error(http.post("/detokenize", json={"tokens": [1]}), 503, code="model_loading")


def test_the_work_runs_off_the_event_loop(http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []

    def recording(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            threads.append(threading.current_thread().name)
            return fn(*args)

        return wrapper

    monkeypatch.setattr(tokenize_api, "tokenize", recording(tokenize_api.tokenize))
    monkeypatch.setattr(tokenize_api, "detokenize", recording(tokenize_api.detokenize))
    ids = tokenize(http, messages=CHAT)["tokens"]
    assert http.post("/detokenize", json={"tokens": ids}).status_code == 200
    assert len(threads) == 2 and LOOP_THREAD not in threads, threads
