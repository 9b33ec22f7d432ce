"""ResponseCache, its key and SingleFlight without a server: LRU order, fixed keys, list-size
rules, which request fields change the key, single flight, thread safety, size 0 and bad flags."""
from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from kvstrata.cli import build_parser
from kvstrata.config import CacheConfig, ModelConfig, SchedulerConfig
from kvstrata.config_flags import from_namespace
from kvstrata.config_server import ServerConfig
from kvstrata.serving.protocol import ChatCompletionRequest, CompletionRequest
from kvstrata.serving.response_cache.cache import ResponseCache
from kvstrata.serving.response_cache.key import (
    CHAT,
    COMPLETIONS,
    is_deterministic,
    load_fixed_keys,
    request_key,
)
from kvstrata.serving.response_cache.single_flight import SingleFlight
from kvstrata.serving.state import ServerState

NS = "smollm2|weights|template"


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields}
    return ChatCompletionRequest.model_validate_json(json.dumps(body))


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate_json(json.dumps({"prompt": "hi", "max_tokens": 8, **fields}))


def test_lru_order_hits_and_adds_move_a_key_to_the_recent_end() -> None:
    cache: ResponseCache[str] = ResponseCache(size=3)
    for k in "abc":
        assert cache.add(k, k.upper(), deterministic=True) == []
    assert cache.keys() == ["a", "b", "c"]
    assert cache.get("a") == "A"  # a hit moves a
    assert cache.keys() == ["b", "c", "a"]
    assert cache.add("d", "D", deterministic=True) == ["b"]  # the least recently used goes
    assert cache.add("c", "C2", deterministic=True) == []  # an add to a full key keeps its result, moves it
    assert cache.get("c") == "C" and cache.keys() == ["a", "d", "c"]
    assert cache.add("e", "E", deterministic=True) == ["a"]
    assert cache.keys() == ["d", "c", "e"] and cache.get("a") is None and cache.get("b") is None
    assert cache.stats().evictions == 2 and cache.stats().entries == 3
    cache.check_integrity()


def test_fixed_keys_survive_pressure_and_do_not_count_in_the_size() -> None:
    cache: ResponseCache[int] = ResponseCache(size=2, fixed_keys=["f1", "f2"])
    cache.add("f1", -1, deterministic=True)
    evicted = [k for i in range(50) for k in cache.add(f"k{i}", i, deterministic=True)]
    assert evicted == [f"k{i}" for i in range(48)]
    assert cache.add("f2", -2, deterministic=True) == []  # fixed keys never push ordinary ones out
    assert cache.get("f1") == -1 and cache.get("f2") == -2
    assert cache.keys() == ["k48", "k49", "f1", "f2"] and cache.stats().fixed_keys == 2
    cache.check_integrity()
    assert cache.flush() == 4 and cache.get("f1") is None and cache.fixed_keys == {"f1", "f2"}


def test_sampled_keys_hit_once_the_list_is_full_deterministic_at_one() -> None:
    cache: ResponseCache[str] = ResponseCache(size=4, list_size=3, seed=0)
    assert cache.needed("s", deterministic=False) == 3
    for i, value in enumerate(["r1", "r2"]):
        cache.add("s", value)
        assert cache.get("s") is None and cache.needed("s", deterministic=False) == 2 - i
    cache.add("s", "r3")
    cache.add("s", "r4")  # the list is full: ignored
    draws = {cache.get("s") for _ in range(300)}
    assert draws == {"r1", "r2", "r3"}
    seeded = {seed: cache.get("s", seed=seed) for seed in range(40)}
    assert all(cache.get("s", seed=s) == v for s, v in seeded.items())  # a seed picks the same result
    assert len(set(seeded.values())) > 1
    assert cache.needed("d", deterministic=True) == 1
    cache.add("d", "only", deterministic=True)
    assert cache.get("d") == "only" and cache.needed("d", deterministic=True) == 0
    cache.check_integrity()


def test_what_makes_a_request_deterministic() -> None:
    assert is_deterministic(chat(temperature=0)) and is_deterministic(chat(temperature=1e-7))  # argmax too
    assert is_deterministic(chat(temperature=0.8, seed=3)) and is_deterministic(completion(seed=0))
    assert not is_deterministic(chat()) and not is_deterministic(chat(temperature=0.8))


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHANGES_OUTPUT = {  # field -> a value that must give another key
    "messages": [{"role": "user", "content": "hello"}], "max_tokens": 9, "max_completion_tokens": 10,
    "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 1, "stop": ["x"], "stop_token_ids": [5], "n": 2,
    "ignore_eos": True, "cache_salt": "tenant-b", "presence_penalty": 0.5, "frequency_penalty": 0.5,
    "min_p": 0.1, "repetition_penalty": 1.2,
    "logit_bias": {"5": 1.0}, "logprobs": True, "top_logprobs": 2, "tools": [TOOL], "tool_choice": "none",
    "response_format": {"type": "json_object"}, "parallel_tool_calls": False,
    "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "none",
}
COMPLETION_CHANGES = {
    "prompt": "hello", "logprobs": 1, "echo": True, "suffix": "x", "best_of": 2,
    **{k: v for k, v in CHANGES_OUTPUT.items() if k in CompletionRequest.model_fields and k != "logprobs"},
}
# the model is None or the served one (others are refused with 404); the namespace names it
NO_EFFECT = {
    "user": "alice", "stream": True, "stream_options": {"include_usage": True}, "model": "smollm2", "timeout": 5.0,
    "prompt_cache_key": "session-1", "prompt_cache_retention": "24h", "data_parallel_rank": 0, "priority": -2,
}


@pytest.mark.parametrize("make, changes", [(chat, CHANGES_OUTPUT), (completion, COMPLETION_CHANGES)])
def test_every_output_affecting_field_changes_the_key_and_no_other(make: Any, changes: dict[str, Any]) -> None:
    model = make().__class__
    assert set(changes) | set(NO_EFFECT) == set(model.model_fields), "classify every request field"
    route = CHAT if model is ChatCompletionRequest else COMPLETIONS
    base = request_key(route, make(), NS)
    keys = {name: request_key(route, make(**{name: value}), NS) for name, value in changes.items()}
    assert base not in keys.values() and len(set(keys.values())) == len(keys)
    for name, value in NO_EFFECT.items():
        assert request_key(route, make(**{name: value}), NS) == base, name
    assert request_key(route, make(cache=False, vendor_extra=1), NS) == base  # fields pydantic ignores
    assert request_key(COMPLETIONS if route == CHAT else CHAT, make(), NS) != base
    assert request_key(route, make(), "smollm2|weights|other-template") != base


def test_a_history_reply_s_reasoning_is_in_the_key() -> None:
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    thought = [turn[0], {**turn[1], "reasoning_content": "plan"}, turn[2]]
    assert request_key(CHAT, chat(messages=turn), NS) != request_key(CHAT, chat(messages=thought), NS)


def test_spellings_of_one_meaning_share_a_key() -> None:
    def same(a: ChatCompletionRequest, b: ChatCompletionRequest) -> bool:
        return request_key(CHAT, a, NS) == request_key(CHAT, b, NS)

    assert same(chat(stop="x"), chat(stop=["x"]))
    assert same(chat(temperature=0), chat(temperature=0.0)) and same(chat(temperature=0), chat(temperature=1e-7))
    assert not same(chat(temperature=0), chat(temperature=-1e-7))  # refused with a 400, never a hit
    assert same(chat(), chat(temperature=1.0, top_p=1, top_k=-1, n=1, presence_penalty=0, stop=[]))
    assert same(chat(max_tokens=9), chat(max_tokens=3, max_completion_tokens=9))  # as protocol.py reads them
    assert same(chat(response_format={"type": "text"}), chat())
    parts = [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]
    dev = chat(messages=[{"role": "developer", "content": parts}])
    assert same(dev, chat(messages=[{"role": "system", "content": "be\nbrief"}]))  # what the template renders
    assert not same(chat(temperature=0), chat(temperature=0.01))
    no_max = CompletionRequest.model_validate_json('{"prompt": "hi"}')
    assert request_key(COMPLETIONS, no_max, NS) == request_key(COMPLETIONS, completion(max_tokens=16), NS)


def test_single_flight_runs_one_generation_for_identical_misses() -> None:
    async def run(needed: int, fail_first: bool) -> tuple[int, list[str]]:
        flights, cache = SingleFlight(), ResponseCache[str](size=4, list_size=needed)
        deterministic = needed == 1
        generations = 0

        async def request(i: int) -> str:
            nonlocal generations
            while True:
                value = cache.get("k")
                if value is not None:
                    return value
                if flights.try_start("k", cache.needed("k", deterministic)):
                    generations += 1
                    mine = generations
                    await asyncio.sleep(0.05)
                    if not (fail_first and mine == 1):
                        cache.add("k", f"result {mine}", deterministic)
                    flights.end("k")
                    if fail_first and mine == 1:
                        return "failed"
                    return f"result {mine}"
                await flights.wait("k")

        results = await asyncio.gather(*(request(i) for i in range(8)))
        return generations, list(results)

    generations, results = asyncio.run(run(1, False))
    assert generations == 1 and results == ["result 1"] * 8
    generations, results = asyncio.run(run(1, True))  # the leader fails: one waiter leads the retry
    assert generations == 2 and sorted(results) == ["failed"] + ["result 2"] * 7
    generations, results = asyncio.run(run(3, False))  # a sampled key needs 3 results: 3 run at once
    assert generations == 3 and set(results) == {"result 1", "result 2", "result 3"}
    with pytest.raises(RuntimeError):
        SingleFlight().end("nobody")


def test_concurrent_get_and_add_from_threads() -> None:
    cache: ResponseCache[tuple[str, int]] = ResponseCache(size=16, list_size=2, fixed_keys=[f"k{i}" for i in range(4)])
    keys = [f"k{i}" for i in range(64)]
    errors: list[str] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        for i in range(3000):
            key = rng.choice(keys)
            if rng.random() < 0.5:
                cache.add(key, (key, i), deterministic=int(key[1:]) % 2 == 0)
            else:
                value = cache.get(key)
                if value is not None and value[0] != key:
                    errors.append(f"{key} returned {value}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    cache.check_integrity()
    stats = cache.stats()
    assert stats.evictions > 0 and stats.entries <= 16 + 4
    assert all(cache.get(f"k{i}") is not None for i in range(4))  # fixed keys filled and kept


def test_size_zero_stores_nothing() -> None:
    cache: ResponseCache[str] = ResponseCache(size=0)
    assert cache.add("a", "A", deterministic=True) == []
    assert cache.get("a") is None and len(cache) == 0 and cache.stats().evictions == 0
    cache.check_integrity()


def _state(**fields: Any) -> ServerState:
    return ServerState(ModelConfig(), CacheConfig(), SchedulerConfig(), ServerConfig(port=0, **fields))


def test_bad_flags_are_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="list size must be >= 1"):
        ResponseCache(size=4, list_size=0)
    with pytest.raises(ValueError, match="size must be >= 0"):
        ResponseCache(size=-1)
    with pytest.raises(ValueError, match="--response-cache-list-size must be at least 1"):
        _state(response_cache_size=8, response_cache_list_size=0)
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match=re.escape(f"--response-cache-fixed-keys {missing}: no such file")):
        _state(response_cache_size=8, response_cache_fixed_keys=str(missing))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "max_tokens": 4}\n\n{"max_tokens": 4}\n')
    with pytest.raises(ValueError, match="line 3: not a request body"):
        _state(response_cache_size=8, response_cache_fixed_keys=str(bad))
    with pytest.raises(ValueError, match="needs the cache on"):
        _state(response_cache_fixed_keys=str(bad))
    assert _state().response_cache.stats()["enabled"] is False  # default: off, cleanly


def test_fixed_keys_file_and_energonai_flag_aliases(tmp_path: Path) -> None:
    path = tmp_path / "fixed.jsonl"
    path.write_text('{"prompt": "p", "max_tokens": 4}\n{"messages": [{"role": "user", "content": "m"}]}\n')
    assert [route for route, _ in load_fixed_keys(str(path))] == [COMPLETIONS, CHAT]
    ns = build_parser().parse_args(["serve", "--cache_size", "5", "--cache_list_size", "2",
                                    "--response-cache-fixed-keys", str(path)])
    cfg = from_namespace(ServerConfig, ns)
    assert (cfg.response_cache_size, cfg.response_cache_list_size) == (5, 2)
    assert _state(response_cache_size=5, response_cache_fixed_keys=str(path)).response_cache.stats()["fixed_keys"] == 2
