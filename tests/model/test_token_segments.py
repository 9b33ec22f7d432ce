"""SegmentCache: a long text tokenized between its special tokens, resent pieces from a cache, gives the
ids the whole text does (SmolLM2's real tokenizer), and cuts only at tokens matched as written."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer as HfTokenizer, models, pre_tokenizers

from kvstrata.model.token_segments import MIN_CHARS, SegmentCache
from kvstrata.model.tokenizer import Tokenizer

PIECES = ["hello world", " leading space", "trailing space ", "\n\n", "  ", "tab\there", "naïve café", "e\u0301",
          "\u0301 a combining mark first", "数字 123 and emoji 🙂", '{"type": "object", "properties": {}}',
          "<|im_start", "im_end|>", "<", ">", "user\n", "assistant\n"]


def whole(tok: Tokenizer, text: str) -> list[int]:
    return tok.backend.encode_batch([text], add_special_tokens=False)[0].ids


def agent_text(rng: random.Random, specials: list[str]) -> str:
    parts = []
    while sum(map(len, parts)) < 2 * MIN_CHARS:
        parts.append(rng.choice(specials) if rng.random() < 0.3 else rng.choice(PIECES) * rng.randint(1, 40))
    return "".join(parts)


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_path(smollm2_path)


def test_pieces_give_the_whole_texts_ids(smollm2: Tokenizer) -> None:
    specials = list(smollm2._segments._ids)
    assert "<|im_start|>" in specials and "<|im_end|>" in specials
    rng = random.Random(0)
    for _ in range(40):
        text = agent_text(rng, specials)
        assert smollm2.encode(text) == whole(smollm2, text)


def test_a_later_turn_tokenizes_only_its_new_pieces(smollm2: Tokenizer) -> None:
    system = "<|im_start|>system\n" + "You can call these tools. " * 400 + "<|im_end|>\n"
    turn1 = system + "<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n"
    turn2 = turn1 + "README.md<|im_end|>\n<|im_start|>user\nopen it<|im_end|>\n<|im_start|>assistant\n"
    cache = smollm2._segments
    assert smollm2.encode(turn1) == whole(smollm2, turn1)
    before = cache.hits
    assert smollm2.encode(turn2) == whole(smollm2, turn2)
    assert cache.hits > before  # the system prompt's pieces came from the cache
    short = "<|im_start|>user\nhi<|im_end|>\n"
    assert cache.encode(short) is None and smollm2.encode(short) == whole(smollm2, short)


def _word_tokenizer(strip: bool) -> HfTokenizer:
    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    tok = HfTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken("<s>", rstrip=strip, lstrip=strip, normalized=False, special=True)])
    return tok


def test_only_tokens_matched_as_written_are_cut_points() -> None:
    assert SegmentCache(_word_tokenizer(strip=False))._ids == {"<s>": 3}
    stripping = SegmentCache(_word_tokenizer(strip=True))
    assert stripping._ids == {} and stripping.encode("a <s> b " * MIN_CHARS) is None  # never cut: whole text
