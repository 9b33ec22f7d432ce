"""Where a reply is copying from: drafts that step over what the model changes.

A reply that copies a text with edits (a JSON list whose items the model counts up, a file with an
identifier renamed) leaves its source at every edit. The suffix search then drafts from wherever the
last few tokens occur (`"id": 14` in the prompt, say, where the reply's format differs), and takes
several steps to find its way back. The drafter instead remembers where its last draft came from and
moves that place on by the tokens each step emits, as if each emitted token had replaced one of the
source's (a substitution); near there (`WINDOW` tokens either way: a few tokens inserted or dropped)
it looks for the alignment that agrees best with the context's last `SPAN` tokens, counting agreeing
tokens until the `MISSES` + 1-th difference (`aligned`). That draft is kept when it agrees better
than the suffix search's own (scored the same way at its source).
"""
from __future__ import annotations

from typing import Sequence

SPAN = 32  # context tokens an alignment is scored over
MISSES = 2  # differences an alignment's score looks past (the edits)
WINDOW = 4  # how far from the expected place an alignment is looked for


def aligned(source: Sequence[int], pos: int, context: Sequence[int]) -> int:
    """How many of the context's last SPAN tokens equal the source's tokens just before `pos`, aligned
    from the end, counted until the MISSES + 1-th difference."""
    score = misses = 0
    for back in range(1, min(SPAN, pos, len(context)) + 1):
        if source[pos - back] == context[-back]:
            score += 1
        else:
            misses += 1
            if misses > MISSES:
                break
    return score


class CopyPointer:
    """A place in a text (the request's own context or a tenant's output) the reply is copying from."""

    def __init__(self, source: Sequence[int], pos: int) -> None:
        self.source = source
        self.pos = pos  # where the next token would come from

    def advance(self, emitted: int) -> None:
        self.pos += emitted

    def best(self, context: Sequence[int]) -> tuple[int, int]:
        """(score, position) of the best alignment near the expected place; the nearest wins ties, and
        where nothing agrees, the expected place itself (score 0)."""
        top, at = 0, self.pos
        for pos in range(max(1, self.pos - WINDOW), min(len(self.source) - 1, self.pos + WINDOW) + 1):
            score = aligned(self.source, pos, context)
            if score > top or (score == top and score and abs(pos - self.pos) < abs(at - self.pos)):
                top, at = score, pos
        return top, at
