"""Where a context has been seen before, and what followed it: the draft source of speculative decoding.

A `TokenIndex` holds token sequences (a tenant's recent outputs) and finds, for the end of a context,
the longest suffix of it (up to `max_match` tokens) that occurs in some sequence with a token after it.
From those occurrences it drafts greedily, as SuffixDecoding walks its suffix tree (Oliaro et al., arXiv
2411.04975): the next token is the one that most often followed the occurrences still in play, its
probability the share of them it covers, and the draft stops when the product of those probabilities
falls under `min_prob` or at `max_tokens` (`walk`, which `context_match.py` shares).

Nothing is indexed: the sequences are int32 arrays, laid end to end (a -1 after each, which no token
equals) when a search first needs them, and a search compares the context's last token with every held
token at once, then narrows the survivors by the token before, and so on, as `ContextMatcher` searches
a request's own tokens. Adding a reply costs a copy, where a hash index of every n-gram cost time on the
engine thread when a request finished and hundreds of MB a tenant; a search over a tenant's tokens stays
in tens of microseconds (docs/speculative.md has the figures).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

SEPARATOR = -1  # between sequences laid end to end: never a token


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    probs: list[float]  # cumulative: probs[i] = estimated chance tokens[0..i] are all accepted
    match_len: int  # tokens of the context's end that matched
    source: tuple[Sequence[int], int] | None = None  # the text and position the first token came from

    @property
    def score(self) -> float:
        """Expected accepted tokens if verified: the sum of the cumulative probabilities."""
        return sum(self.probs)


EMPTY = Draft([], [], 0)


class TokenIndex:
    def __init__(self, max_match: int = 16, max_occurrences: int = 64) -> None:
        if max_match < 1 or max_occurrences < 1:
            raise ValueError("max_match and max_occurrences must be at least 1")
        self.max_match = max_match
        self.max_occurrences = max_occurrences  # the most recent occurrences a draft looks at
        self._seqs: dict[int, np.ndarray] = {}  # oldest first
        self._laid: tuple[np.ndarray, np.ndarray, list[np.ndarray]] | None = None  # (tokens, starts, views)
        self.num_tokens = 0  # over the sequences held

    def __contains__(self, seq: int) -> bool:
        return seq in self._seqs

    def oldest(self) -> int | None:
        """The sequence held longest (first extended), or None."""
        return next(iter(self._seqs), None)

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sequence `seq` (created if new)."""
        new = np.asarray(tokens, dtype=np.int32)
        old = self._seqs.get(seq)
        self._seqs[seq] = new.copy() if old is None else np.concatenate([old, new])
        self.num_tokens += len(new)
        self._laid = None

    def drop(self, seq: int) -> None:
        """Forget sequence `seq`."""
        s = self._seqs.pop(seq, None)
        if s is not None:
            self.num_tokens -= len(s)
            self._laid = None

    def _layout(self) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """The sequences end to end, each followed by SEPARATOR; each one's start there; each one's view."""
        if self._laid is None:
            seqs = list(self._seqs.values())
            sizes = np.array([len(s) + 1 for s in seqs], dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            flat = np.full(int(sizes.sum()), SEPARATOR, dtype=np.int32)
            for s, at in zip(seqs, starts.tolist()):
                flat[at:at + len(s)] = s
            self._laid = flat, starts, [flat[at:at + len(s)] for s, at in zip(seqs, starts.tolist())]
        return self._laid

    def propose(self, context: Sequence[int], max_tokens: int, min_prob: float = 0.1, min_match: int = 1) -> Draft:
        """The draft for what follows `context`, from the longest suffix of it (>= min_match tokens)
        seen in a sequence with a continuation. Changes nothing."""
        if max_tokens < 1 or not context or not self._seqs:
            return EMPTY
        flat, starts, views = self._layout()
        tail = np.asarray(context[-self.max_match:], dtype=np.int64)
        ends = np.flatnonzero(flat[:-1] == tail[-1])  # the flat ends with a SEPARATOR: ends + 1 is in it
        # a token follows, in the same sequence; a SEPARATOR never equals a token: no match spans two
        ends, n = longest_match(flat, ends[flat[ends + 1] != SEPARATOR], tail)
        if not ends.size or n < min_match:
            return EMPTY
        occ = ends[-self.max_occurrences:]
        which = (np.searchsorted(starts, occ, side="right") - 1).tolist()
        d = walk([(views[k], e - int(starts[k]) + 1) for k, e in zip(which, occ.tolist())], n, max_tokens, min_prob)
        return Draft([int(t) for t in d.tokens], d.probs, d.match_len, d.source)


def longest_match(tokens: np.ndarray, ends: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, int]:
    """Of `ends` (positions in `tokens` that hold tail's last token), those where the longest suffix of `tail`
    found at any of them ends, and its length: the survivors are narrowed by the token before, then the
    one before that, while some survive (at most len(tail) tokens)."""
    n = 1
    while ends.size and n < len(tail):
        ends_n = ends[ends >= n]
        longer = ends_n[tokens[ends_n - n] == tail[-1 - n]]
        if not longer.size:
            break
        ends, n = longer, n + 1
    return ends, n


def walk(pos: list[tuple[Sequence[int], int]], match_len: int, max_tokens: int, min_prob: float) -> Draft:
    """Draft from the occurrences of a match: `pos` holds (tokens, where the occurrence continues), oldest
    first. The next token is the one most of them continue with (ties: the newest's), its probability the
    share of them it covers, times the ones before; the walk stops under `min_prob` or at `max_tokens`.
    The draft's source is the newest occurrence it follows."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    source: tuple[Sequence[int], int] | None = None
    while pos and len(tokens) < max_tokens:
        nxt = [toks[i] for toks, i in pos]
        tok = nxt[-1]
        hits = nxt.count(tok)
        if 2 * hits <= len(nxt):  # the newest's token holds no majority: count them all (a copy seldom gets here)
            tok, hits = max(Counter(nxt).items(), key=lambda kv: (kv[1], kv[0] == nxt[-1]))
        prob *= hits / len(pos)
        if prob < min_prob:
            break
        if source is None:  # the newest occurrence the draft follows
            source = next(p for p, t in zip(reversed(pos), reversed(nxt)) if t == tok)
        tokens.append(tok)
        probs.append(prob)
        pos = [(toks, i + 1) for (toks, i), t in zip(pos, nxt) if t == tok and i + 1 < len(toks)]
    return Draft(tokens, probs, match_len, source)
