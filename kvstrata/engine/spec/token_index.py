"""Where a context has been seen before, and what followed it: the draft source of speculative decoding.

A `TokenIndex` holds token sequences (a request's prompt and output, or a tenant's recent outputs) and
finds, for the end of a context, the longest suffix of it (up to `max_match` tokens) that occurs earlier
in some sequence. From those occurrences it drafts greedily, as SuffixDecoding walks its suffix tree
(Oliaro et al., arXiv 2411.04975): the next token is the one that most often followed the occurrences
still in play, its probability the share of them it covers, and the draft stops when the product of
those probabilities falls under `min_prob` or at `max_tokens`. The tree here is implicit: every n-gram
of length 1..max_match is indexed by a rolling hash to the positions where it ends, so a draft can run
as long as the sequences allow (no depth bound), and matches are verified token by token (a hash
collision never drafts from the wrong place).

    index: {n: {hash of n tokens: [(seq, end position), ...]}}    appended in order: oldest first
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

MOD = (1 << 61) - 1
BASE = 1_000_003


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


@dataclass
class _Sequence:
    tokens: list[int] = field(default_factory=list)


class TokenIndex:
    def __init__(self, max_match: int = 16, max_occurrences: int = 64) -> None:
        if max_match < 1 or max_occurrences < 1:
            raise ValueError("max_match and max_occurrences must be at least 1")
        self.max_match = max_match
        self.max_occurrences = max_occurrences  # the most recent occurrences a draft looks at
        self._seqs: dict[int, _Sequence] = {}
        self._index: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(max_match)]
        self._pow = [pow(BASE, i, MOD) for i in range(max_match)]
        self._dead = 0  # index entries of dropped sequences, removed when they outnumber the live ones
        self._live = 0
        self.num_tokens = 0  # over the sequences held

    def __contains__(self, seq: int) -> bool:
        return seq in self._seqs

    def tokens(self, seq: int) -> list[int]:
        """Sequence `seq`'s tokens (the index's own list: read, do not change)."""
        return self._seqs[seq].tokens

    def oldest(self) -> int | None:
        """The sequence held longest (first extended), or None."""
        return next(iter(self._seqs), None)

    def extend(self, seq: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sequence `seq` (created if new), indexing every n-gram they end."""
        s = self._seqs.setdefault(seq, _Sequence())
        for tok in tokens:
            # the last n tokens' hash, read from the end: h_n = h_{n-1} + tok_{-n} * BASE^(n-1)
            hashes = [(tok + 1) % MOD]
            for n in range(2, min(self.max_match, len(s.tokens) + 1) + 1):
                prev = s.tokens[-(n - 1)]
                hashes.append((hashes[-1] + (prev + 1) * self._pow[n - 1]) % MOD)
            s.tokens.append(tok)
            end = len(s.tokens) - 1
            for n, h in enumerate(hashes, start=1):
                self._index[n - 1].setdefault(h, []).append((seq, end))
            self._live += len(hashes)
        self.num_tokens += len(tokens)

    def drop(self, seq: int) -> None:
        """Forget sequence `seq`; its index entries go lazily (skipped, then compacted)."""
        s = self._seqs.pop(seq, None)
        if s is None:
            return
        self.num_tokens -= len(s.tokens)
        n = sum(min(self.max_match, i + 1) for i in range(len(s.tokens)))
        self._live -= n
        self._dead += n
        if self._dead > self._live:
            self._compact()

    def _compact(self) -> None:
        for table in self._index:
            for h in list(table):
                kept = [e for e in table[h] if e[0] in self._seqs]
                if kept:
                    table[h] = kept
                else:
                    del table[h]
        self._dead = 0

    def _suffix_hashes(self, context: Sequence[int], n: int) -> list[int]:
        """The hashes of the context's last 1..n tokens, each from the one before (as `extend` builds them)."""
        hashes, h = [], 0
        for i in range(1, n + 1):
            h = (h + (context[-i] + 1) * self._pow[i - 1]) % MOD
            hashes.append(h)
        return hashes

    def _occurrences(self, context: Sequence[int], n: int, h: int,
                     exclude: tuple[int, int] | None) -> list[tuple[int, int]]:
        """(seq, end) where the context's last n tokens (hash h) occur and something follows, newest last."""
        found = []
        tail = list(context[-n:])
        for seq, end in self._index[n - 1].get(h, ()):
            s = self._seqs.get(seq)
            if s is None or (seq, end) == exclude or end + 1 >= len(s.tokens) or end + 1 < n:
                continue
            if s.tokens[end - n + 1:end + 1] == tail:  # a hash collision drafts nothing
                found.append((seq, end))
        return found[-self.max_occurrences:]

    def propose(self, context: Sequence[int], max_tokens: int, min_prob: float = 0.1, min_match: int = 1,
                exclude: tuple[int, int] | None = None) -> Draft:
        """The draft for what follows `context`, from the longest suffix of it (>= min_match tokens)
        seen before with a continuation. `exclude`: an occurrence not to use (the context itself, when
        it is one of the indexed sequences). Changes nothing."""
        if max_tokens < 1:
            return EMPTY
        top = min(self.max_match, len(context))
        hashes = self._suffix_hashes(context, top)
        for n in range(top, min_match - 1, -1):
            occ = self._occurrences(context, n, hashes[n - 1], exclude)
            if occ:
                return self._walk(occ, n, max_tokens, min_prob)
        return EMPTY

    def _walk(self, occ: list[tuple[int, int]], match_len: int, max_tokens: int, min_prob: float) -> Draft:
        return walk([(self._seqs[seq].tokens, end + 1) for seq, end in occ], match_len, max_tokens, min_prob)


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
        counts = Counter(toks[i] for toks, i in pos)
        tok, hits = max(counts.items(), key=lambda kv: (kv[1], kv[0] == pos[-1][0][pos[-1][1]]))
        prob *= hits / len(pos)
        if prob < min_prob:
            break
        if source is None:  # the newest occurrence the draft follows
            source = next((toks, i) for toks, i in reversed(pos) if toks[i] == tok)
        tokens.append(tok)
        probs.append(prob)
        pos = [(toks, i + 1) for toks, i in pos if toks[i] == tok and i + 1 < len(toks)]
    return Draft(tokens, probs, match_len, source)
