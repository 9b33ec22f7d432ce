"""The request's own context as a draft source (kvstrata/engine/spec/context_match.py): the same drafts as a
TokenIndex holding that context alone, found without building an index."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.engine.spec.context_match import ContextMatcher
from kvstrata.engine.spec.token_index import TokenIndex


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=120), st.integers(1, 6), st.integers(1, 3),
       st.sampled_from([0.05, 0.3, 0.9]), st.integers(1, 17))
def test_drafts_match_a_token_index_over_the_context(tokens: list[int], max_tokens: int, min_match: int,
                                                     min_prob: float, max_match: int) -> None:
    index = TokenIndex(max_match)
    index.extend(0, tokens)
    matcher = ContextMatcher(tokens[: len(tokens) // 2], max_match)
    matcher.extend(tokens[len(tokens) // 2 :])  # grown in two parts: the array regrows
    a, b = matcher.propose(max_tokens, min_prob, min_match), index.propose(tokens, max_tokens, min_prob, min_match)
    assert (a.tokens, a.probs, a.match_len) == (b.tokens, b.probs, b.match_len)
    assert (a.source is None) == (b.source is None)
    if a.source is not None and b.source is not None:  # the same place: the index holds the context as a copy
        assert a.source[1] == b.source[1] and list(a.source[0]) == list(b.source[0])


def test_a_copied_document_is_drafted_from_where_it_was() -> None:
    rng = random.Random(0)
    doc = [rng.randrange(1000, 2000) for _ in range(300)]
    m = ContextMatcher([1, 2, 3] + doc + [4, 5] + doc[:10], max_match=16)
    d = m.propose(8, min_match=2)
    assert d.tokens == doc[10:18] and d.match_len == 10 and d.probs == [1.0] * 8
    assert ContextMatcher([7, 8, 9]).propose(4) == ContextMatcher([]).propose(4)  # nothing repeats: no draft
