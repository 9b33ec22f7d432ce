"""bench/text.py: seeded prose of a given length and the tokenizer-free count."""
from __future__ import annotations

import random

import pytest

from kvstrata.bench.text import WORDS, approx_tokens, prose, sentence


def test_approx_tokens_counts_words_digits_newlines_and_punctuation_runs() -> None:
    assert approx_tokens("Hello world.") == 3
    assert approx_tokens("id 2024\n{\"a\": 1}") == 1 + 4 + 1 + 5  # digits one by one; `{"`, `":` and `}` are runs
    assert approx_tokens("") == 0


@pytest.mark.parametrize("tokens", [2, 7, 60, 500])
def test_prose_is_about_the_asked_length_in_the_vocabulary(tokens: int) -> None:
    text = prose(random.Random(tokens), tokens)
    assert tokens - 1 <= approx_tokens(text) <= tokens
    assert {w.strip(".").lower() for w in text.split()} <= set(WORDS)


def test_prose_is_seeded() -> None:
    assert prose(random.Random(3), 100) == prose(random.Random(3), 100)
    assert prose(random.Random(3), 100) != prose(random.Random(4), 100)
    assert prose(random.Random(0), 1) == ""


def test_sentence_is_capitalized_and_ends_with_a_period() -> None:
    text = sentence(random.Random(1), 5)
    assert text[0].isupper() and text.endswith(".")
    assert len(text.split()) == 5
