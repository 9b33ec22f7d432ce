"""IncrementalDetokenizer: streamed deltas add up to the full decode, never with half characters."""
from __future__ import annotations

from typing import Any

import pytest

from kvstrata.model.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello 😀 world, 你好世界! 🇯🇵 and 👨‍👩‍👧‍👦 family.",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji only: 🤖🧠🚀🔥💯🎉",
    "mixed ascii and café Straße — “quotes” … done\n\tindent",
]


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.feed(i) for i in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(smollm2_tokenizer: Any, text: str) -> None:
    ids = smollm2_tokenizer.encode(text)
    detok = IncrementalDetokenizer(smollm2_tokenizer)
    deltas = _stream(detok, ids)
    assert "".join(deltas) == smollm2_tokenizer.decode(ids) == text
    assert detok.text == text
    assert all("\ufffd" not in d for d in deltas)


def test_split_characters_are_held_back(smollm2_tokenizer: Any) -> None:
    ids = smollm2_tokenizer.encode("🤖🧠")
    # Byte-level BPE splits these emoji over several tokens: alone, a token is not valid UTF-8.
    assert any("\ufffd" in smollm2_tokenizer.decode([i]) for i in ids)
    deltas = _stream(IncrementalDetokenizer(smollm2_tokenizer), ids)
    assert "" in deltas  # at least one step emitted nothing while a character was incomplete
    assert [d for d in deltas if d] == ["🤖", "🧠"]


def test_with_prompt_context(smollm2_tokenizer: Any) -> None:
    prompt = smollm2_tokenizer.encode(smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]))
    generated = smollm2_tokenizer.encode("Sure! 😀 Here: 日本.") + [2]  # ends with <|im_end|>
    detok = IncrementalDetokenizer(smollm2_tokenizer, prompt_ids=prompt)
    streamed = "".join(_stream(detok, generated))
    full = smollm2_tokenizer.decode(prompt + generated)
    assert streamed == full[len(smollm2_tokenizer.decode(prompt)):] == "Sure! 😀 Here: 日本."
    assert detok.text == streamed


def test_special_tokens_kept_when_asked(smollm2_tokenizer: Any) -> None:
    ids = smollm2_tokenizer.encode("a<|im_end|>b")
    assert "".join(_stream(IncrementalDetokenizer(smollm2_tokenizer), ids)) == "ab"
    kept = IncrementalDetokenizer(smollm2_tokenizer, skip_special_tokens=False)
    assert "".join(_stream(kept, ids)) == "a<|im_end|>b"


def test_flush_releases_an_incomplete_tail(smollm2_tokenizer: Any) -> None:
    ids = smollm2_tokenizer.encode("ok 😀")
    detok = IncrementalDetokenizer(smollm2_tokenizer)
    deltas = _stream(detok, ids[:-1])  # stop mid-emoji
    assert "".join(deltas) == "ok"
    tail = detok.flush()
    assert tail.startswith(" ") and tail.endswith("\ufffd")
    assert detok.text == smollm2_tokenizer.decode(ids[:-1])


class _SentencePieceLike:
    """Decodes like a sentencepiece tokenizer: '▁' is a space and the text's leading space is dropped."""

    vocab = {0: "▁Hello", 1: "▁world", 2: "!", 3: "▁how"}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.vocab[i] for i in ids).replace("▁", " ").lstrip(" ")


def test_leading_space_kept_between_tokens() -> None:
    detok = IncrementalDetokenizer(_SentencePieceLike(), prompt_ids=[0])
    assert [detok.feed(i) for i in (1, 2, 3)] == [" world", "!", " how"]
