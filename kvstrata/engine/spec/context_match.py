"""The request's own context as a draft source: where its last tokens occurred before in it.

The same drafts as a `TokenIndex` holding the context alone (token_index.py: the longest earlier
occurrence of the context's end, at most `max_match` tokens, then the majority continuation), found
without an index: the context also lives in a numpy array, and a draft compares its last token with
every earlier one at once, then narrows those positions by the token before, and so on (at most
`max_match` vector compares over the surviving positions). An index costs ~16 dict inserts a token
when a request starts (tens of ms for a few thousand prompt tokens, on the engine thread); this costs
tens of microseconds a draft and nothing up front.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from kvstrata.engine.spec.token_index import EMPTY, Draft, longest_match, walk


class ContextMatcher:
    def __init__(self, tokens: Sequence[int], max_match: int = 16, max_occurrences: int = 64) -> None:
        if max_match < 1 or max_occurrences < 1:
            raise ValueError("max_match and max_occurrences must be at least 1")
        self.max_match = max_match
        self.max_occurrences = max_occurrences
        self.tokens: list[int] = []  # the context (the walk reads it; the array is for the search)
        self._arr = np.empty(max(64, 2 * len(tokens)), dtype=np.int64)
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        n, k = len(self.tokens), len(tokens)
        if n + k > self._arr.shape[0]:
            grown = np.empty(2 * (n + k), dtype=np.int64)
            grown[:n] = self._arr[:n]
            self._arr = grown
        self._arr[n : n + k] = tokens
        self.tokens.extend(tokens)

    def propose(self, max_tokens: int, min_prob: float = 0.1, min_match: int = 1) -> Draft:
        """The draft for what follows the context, from the longest suffix of it (>= min_match tokens) that
        occurred earlier with a continuation."""
        L = len(self.tokens)
        if max_tokens < 1 or L < 2:
            return EMPTY
        arr = self._arr
        ends = np.flatnonzero(arr[: L - 1] == arr[L - 1])  # earlier occurrences of the last token: something follows
        ends, n = longest_match(arr, ends, arr[L - min(self.max_match, L - 1) : L])
        if not ends.size or n < min_match:
            return EMPTY
        occ = ends[-self.max_occurrences :].tolist()
        return walk([(self.tokens, e + 1) for e in occ], n, max_tokens, min_prob)
