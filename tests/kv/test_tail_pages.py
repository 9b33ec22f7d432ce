"""TailPages: part pages kept per prefix hash, taken once by a request whose tokens go on the same way."""
from __future__ import annotations

from kvstrata.kv.tail_pages import TailPages


def test_take_gives_the_page_and_the_tokens_that_agree_once() -> None:
    tails = TailPages(capacity=4)
    assert tails.put(b"a", [5, 6, 7], page=3) == []
    assert tails.take(b"b", [5, 6, 7], limit=10) is None  # another prefix
    assert tails.take(b"a", [9, 6, 7], limit=10) is None  # differs at once: the tail stays
    assert tails.take(b"a", [5, 6, 7], limit=0) is None  # nothing may be skipped
    assert tails.take(b"a", [5, 6, 8, 1], limit=10) == (3, 2)
    assert tails.take(b"a", [5, 6, 7], limit=10) is None  # taken: the page is the request's now
    assert (len(tails), tails.hits, tails.tokens_hit) == (0, 1, 2)


def test_take_stops_at_the_limit() -> None:
    tails = TailPages(capacity=4)
    tails.put(b"a", [5, 6, 7], page=3)
    assert tails.take(b"a", [5, 6, 7, 8], limit=1) == (3, 1)


def test_put_replaces_a_key_and_drops_the_oldest_past_capacity() -> None:
    tails = TailPages(capacity=2)
    assert tails.put(b"a", [1], page=1) == []
    assert tails.put(b"a", [2], page=2) == [1]  # one tail a prefix: the newer
    assert tails.put(b"b", [3], page=3) == []
    assert tails.put(b"c", [4], page=4) == [2]  # past capacity: the least recently kept
    assert sorted(tails.pages()) == [3, 4]
    assert tails.evict(1) == [3]
    assert tails.clear() == [4] and len(tails) == 0
