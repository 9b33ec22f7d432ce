"""The copy pointer (kvstrata/engine/spec/copy_pointer.py): alignment past the model's edits."""
from __future__ import annotations

from kvstrata.engine.spec.copy_pointer import MISSES, CopyPointer, aligned


def test_aligned_counts_agreement_past_a_few_differences() -> None:
    source = list(range(10, 40))
    context = source[:20] + [99]  # the source copied up to 29, then a changed token
    assert aligned(source, 21, context) == 20  # the changed token is one difference
    every_third = [0 if k % 3 == 2 else source[k] for k in range(21)]  # ..., x, x, 0, x, x, 0 (the last is a 0)
    assert aligned(source, 21, every_third) == 2 * MISSES  # two agreeing tokens between differences
    assert aligned(source, 0, context) == 0


def test_the_pointer_moves_on_and_realigns_near_where_it_expects() -> None:
    source = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    p = CopyPointer(source, 3)  # the next token would be source[3] (4)
    p.advance(2)  # 4 and a substitution for 5 emitted
    assert p.pos == 5 and p.best([1, 2, 3, 4, 50]) == (4, 5)  # 6 next
    p = CopyPointer(source, 4)
    p.advance(2)  # two tokens (50, 51) written for 5: taken as substitutions for 5 and 6
    assert p.best([1, 2, 3, 4, 50, 51]) == (4, 6)
    p.advance(1)  # then the model writes 6 after all: the alignment a token back agrees with it
    assert p.best([1, 2, 3, 4, 50, 51, 6]) == (1, 6)  # 7 next
    assert CopyPointer(source, 40).best([1, 2]) == (0, 40)  # past the end: nothing to align
