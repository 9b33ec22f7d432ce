"""Synthetic English text for workloads: `prose` of a given token length, and `approx_tokens`, a count
that needs no tokenizer.

The words are a fixed vocabulary of common English words, which most BPE tokenizers keep as one token
each, so `approx_tokens` tracks a real tokenizer's count closely. The agentic, multiround, fleet and
scan workloads and the HTTP throughput probe draw their text from here.
"""
from __future__ import annotations

import random
import re

WORDS: tuple[str, ...] = tuple("""
the of and to in is you that it was for on are as with they at be this have from or one had by
word but not what all were we when your can said there use each which she do how their if will up
other about out many then them these so some her would make like into time has look two more write
go see number no way could people my than first water been call who its now find long down day did
get come made may part over new sound take only little work know place year live me back give most
very after thing our just name good sentence man think say great where help through much before
line right too mean old any same tell boy follow came want show also around form three small set
put end does another well large must big even such because turn here why ask went men read need
land different home us move try kind hand picture again change off play spell air away animal house
point page letter mother answer found study still learn should world high every near add food
between own below country plant last school father keep tree never start city earth eye light
thought head under story saw left few while along might close something seem next hard open example
begin life always those both paper together got group often run important until children side feet
car mile night walk white sea began grow took river four carry state once book hear stop without
second later miss idea enough eat face watch far really almost let above girl sometimes mountain
cut young talk soon list song being leave family order account report record customer invoice
payment shipping address product price status ticket message team project file document user
""".split())
_PIECE = re.compile(r"[A-Za-z]+|[0-9]|\n|[^A-Za-z0-9\s]+")


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate: words, digits, newlines, punctuation runs."""
    return len(_PIECE.findall(text))


def words(rng: random.Random, n: int) -> str:
    """`n` words of the vocabulary (at least one), space-separated."""
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


def sentence(rng: random.Random, n_words: int) -> str:
    """`n_words` words, capitalized, with a period."""
    text = words(rng, n_words)
    return text[0].upper() + text[1:] + "."


def prose(rng: random.Random, tokens: int) -> str:
    """Sentences of 6-18 words until about `tokens` tokens (one per word, one per period)."""
    sentences: list[str] = []
    left = tokens
    while left > 1:
        n = min(rng.randint(6, 18), left - 1)
        sentences.append(sentence(rng, n))
        left -= n + 1
    return " ".join(sentences)
