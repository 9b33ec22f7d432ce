"""The tenant's draft source (kvstrata/engine/spec/token_index.py): the longest earlier occurrence of the
context's end, the majority continuation with its share as probability, drafts past the match length,
sequences kept apart (no match across two), dropped sequences gone, and a brute-force reference over
random sequences."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstrata.engine.spec.token_index import TokenIndex


def test_a_repeated_passage_is_drafted_from_its_first_copy() -> None:
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    index = TokenIndex(max_match=4)
    index.extend(0, [1, 2] + text + [3] + text[:3])  # the context ends inside a second copy
    draft = index.propose([1, 2] + text + [3] + text[:3], max_tokens=5)
    assert draft.tokens == [8, 9, 10, 11, 12] and draft.match_len == 3  # [5, 6, 7]; [3, 5, 6, 7] only ends it
    assert draft.probs == [1.0] * 5 and draft.score == 5.0


def test_drafts_run_past_the_indexed_match_length() -> None:
    index = TokenIndex(max_match=2)
    passage = list(range(100, 140))
    index.extend(0, passage + [1] + passage[:2])
    assert index.propose(passage + [1] + passage[:2], max_tokens=30).tokens == passage[2:32]


def test_the_longest_match_wins_and_the_majority_continuation_with_its_share() -> None:
    index = TokenIndex(max_match=4)
    # after [7, 8]: 1 three times, 2 once; after [6, 7, 8]: 3 once
    index.extend(0, [7, 8, 1, 0, 7, 8, 1, 0, 7, 8, 2, 0, 7, 8, 1, 0, 6, 7, 8, 3, 0])
    short = index.propose([9, 7, 8], max_tokens=1)
    assert short.tokens == [1] and short.match_len == 2 and abs(short.probs[0] - 3 / 5) < 1e-9
    long = index.propose([6, 7, 8], max_tokens=1)
    assert long.tokens == [3] and long.match_len == 3 and long.probs == [1.0]


def test_min_prob_stops_an_uncertain_draft() -> None:
    index = TokenIndex(max_match=2)
    index.extend(0, [4, 1, 9, 4, 2, 9, 4, 3, 9, 4, 1, 9])
    assert index.propose([4], max_tokens=3, min_prob=0.6).tokens == []  # 1 follows 4 in 2 of 4
    draft = index.propose([4], max_tokens=3, min_prob=0.5)
    assert draft.tokens == [1, 9, 4] and draft.probs == [0.5, 0.5, 0.5] and draft.score == 1.5


def test_sequences_are_kept_apart_and_a_dropped_one_drafts_nothing() -> None:
    index = TokenIndex(max_match=3)
    index.extend(1, [1, 2, 3])
    index.extend(2, [4, 5, 6, 7])
    assert index.propose([9, 3], max_tokens=2).tokens == []  # [3] ends sequence 1: nothing follows it there
    assert index.propose([5], max_tokens=3).tokens == [6, 7]
    index.drop(2)
    assert 2 not in index and index.propose([5], max_tokens=3).tokens == []
    for i in range(3, 40):  # many added and dropped: the live ones still draft
        index.extend(i, [50 + i, 60 + i])
        index.drop(i)
    assert index.propose([1, 2], max_tokens=1).tokens == [3] and index.num_tokens == 3


def test_a_match_never_spans_two_sequences() -> None:
    """The sequences lie end to end when searched: a context whose end joins one sequence's last tokens to
    the next one's first matches neither across the junction."""
    index = TokenIndex(max_match=4)
    index.extend(1, [1, 2, 3])
    index.extend(2, [4, 5, 6])
    draft = index.propose([2, 3, 4], max_tokens=3)
    assert draft.tokens == [5, 6] and draft.match_len == 1  # [4] in sequence 2; [3, 4] is no match
    assert isinstance(draft.tokens[0], int) and list(draft.source[0]) == [4, 5, 6]  # type: ignore[index]
    index.extend(1, [4, 7])  # sequence 1 grows: [1, 2, 3, 4, 7]
    assert index.propose([2, 3, 4], max_tokens=1).tokens == [7] and index.num_tokens == 8


def _reference_first(seq: list[int], context: list[int], max_match: int, max_occ: int) -> tuple[int, list[int]]:
    """Brute force: the longest suffix (<= max_match) of context ending earlier in seq with a token
    after it; the most recent max_occ occurrences' next tokens, counted."""
    for n in range(min(max_match, len(context)), 0, -1):
        tail = context[-n:]
        ends = [e for e in range(n - 1, len(seq) - 1) if seq[e - n + 1:e + 1] == tail][-max_occ:]
        if ends:
            counts = Counter(seq[e + 1] for e in ends)
            best = max(counts.values())
            return n, sorted(t for t, c in counts.items() if c == best)
    return 0, []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=80), st.lists(st.integers(0, 3), min_size=1, max_size=6))
def test_the_first_drafted_token_matches_a_brute_force_reference(seq: list[int], context: list[int]) -> None:
    index = TokenIndex(max_match=5, max_occurrences=6)
    index.extend(0, seq)
    draft = index.propose(context, max_tokens=1, min_prob=1e-9)
    n, best = _reference_first(seq, context, 5, 6)
    assert draft.match_len == n
    assert (draft.tokens[0] in best) if best else draft.tokens == []


def test_the_most_recent_occurrences_decide() -> None:
    index = TokenIndex(max_match=2, max_occurrences=6)
    index.extend(0, [0, 1] * 6 + [0, 2] * 6 + [0])  # 1 followed the first six 0s, 2 the last six
    assert index.propose([0], max_tokens=1).tokens == [2]
