"""The gateway hashes a request's prompt exactly as a rank would: same tokens, same page hashes."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvstrata.kv.hashing import hash_pages, hash_to_int64, namespace_root
from kvstrata.model.tokenizer import Tokenizer
from kvstrata.router.prompt import PromptHasher, SegmentEncoder

ROOT = namespace_root("test/model", "float32", 16, "nhd")
CHAT = "/v1/chat/completions"
TEXTS = [
    "plain words, then  two spaces and\n\nnewlines\t tabs",
    "a user who types <|im_end|> and <|im_start|>assistant in the middle",
    "<|im_start|>user\n  leading spaces<|im_end|>\n<|im_start|>assistant\n",
    "ünïcödé, emoji 🙂🚀, CJK 漢字, numbers 1234567 3.14159",
    "",
    "<|endoftext|><|endoftext|>",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_path(tiny_model_dir)


def test_segment_encoder_equals_the_tokenizer(tokenizer: Tokenizer) -> None:
    encode = SegmentEncoder(tokenizer)
    for text in TEXTS + ["".join(TEXTS)]:
        for _ in range(2):  # cold, then from the memo
            assert encode(text) == tokenizer.encode(text), text


def test_segment_memo_is_bounded(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SegmentEncoder, "MAX_SEGMENTS", 4)
    encode = SegmentEncoder(tokenizer)
    for i in range(10):
        assert encode(f"message {i}<|im_end|>") == tokenizer.encode(f"message {i}<|im_end|>")
    assert len(encode._memo) == 4  # noqa: SLF001


def test_chat_prompt_tokens_and_hashes_match_the_rank(tokenizer: Tokenizer) -> None:
    hasher = PromptHasher(tokenizer, 16, ROOT)
    messages = [
        {"role": "developer", "content": "You are terse. " * 20},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "ok <|im_end|> sure"},
        {"role": "user", "content": "and again"},
    ]
    body = {"messages": messages, "temperature": 0, "data_parallel_rank": 1}
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "part one\npart two"},
         {"role": "assistant", "content": "ok <|im_end|> sure"}, {"role": "user", "content": "and again"}],
        add_generation_prompt=True,
    )
    tokens = tokenizer.encode(rendered)
    prompt = hasher.prompt(CHAT, body)
    assert prompt is not None and prompt.num_tokens == len(tokens)
    n = (len(tokens) - 1) // 16  # the pages a rank can match: never the last token's
    assert prompt.hashes == [hash_to_int64(h) for h in hash_pages(tokens, 16, ROOT)[:n]]
    salted = hasher.prompt(CHAT, {**body, "cache_salt": "tenant-a"})
    assert salted is not None and not set(salted.hashes) & set(prompt.hashes)


def test_completions_and_unrenderable_bodies(tokenizer: Tokenizer) -> None:
    hasher = PromptHasher(tokenizer, 16, ROOT)
    assert hasher.tokens("/v1/completions", {"prompt": "hello there"}) == tokenizer.encode("hello there")
    assert hasher.tokens("/v1/completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert hasher.tokens("/v1/completions", {"prompt": ["first", "second"]}) == tokenizer.encode("first")
    assert hasher.prompt(CHAT, {"messages": "not a list"}) is None  # the rank will answer the 400
    assert hasher.prompt(CHAT, {"messages": [{"role": "wizard", "content": "x"}]}) is None
    assert hasher.prompt("/v1/completions", {"prompt": [-1]}) is None
