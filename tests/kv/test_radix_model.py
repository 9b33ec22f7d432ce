"""The radix prefix cache (kvstrata/kv/radix.py) against a brute-force model: random sequences of
matches, inserts, locks, unlocks, evictions and resets (hypothesis); after every step the tree holds
exactly the model's pages, the pool's accounting balances and the tree passes its own integrity check."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstrata.kv.hashing import hash_pages, namespace_root
from kvstrata.kv.pool import PagePool
from kvstrata.kv.radix import Node, RadixPrefixCache

SPS = 2  # small page size and alphabet, so prompts share and diverge often
SROOT = namespace_root("test/model", "float32", SPS, "nhd")
prompts = st.lists(st.integers(0, 2), min_size=1, max_size=9)
keys = st.sampled_from([None, "", "a"])


@dataclass
class Entry:
    page: int
    stamp: int
    lock_ref: int = 0


class Model:
    """(extra_key, token prefix of whole pages) -> Entry; LRU by a clock ticked on lock and insert."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, tuple[int, ...]], Entry] = {}
        self.clock = 0

    def match(self, tokens: list[int], key: str) -> list[int]:
        pages = []
        for i in range(1, (len(tokens) - 1) // SPS + 1):
            e = self.entries.get((key, tuple(tokens[: i * SPS])))
            if e is None:
                break
            pages.append(e.page)
        return pages

    def lock(self, key: str, prefix: tuple[int, ...], delta: int) -> None:
        self.clock += delta > 0
        for i in range(1, len(prefix) // SPS + 1):
            e = self.entries[(key, prefix[: i * SPS])]
            e.lock_ref += delta
            if delta > 0:
                e.stamp = self.clock

    def insert(self, tokens: list[int], pages: list[int], key: str) -> list[int]:
        k = len(tokens) // SPS
        self.clock += k > 0
        dups = []
        for i in range(k):
            e = self.entries.setdefault((key, tuple(tokens[: (i + 1) * SPS])), Entry(pages[i], self.clock))
            e.stamp = self.clock
            if e.page != pages[i]:
                dups.append(pages[i])
        return dups

    def evict(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            parents = {(k, p[:-SPS]) for k, p in self.entries}
            leaves = [(e.stamp, kp) for kp, e in self.entries.items() if not e.lock_ref and kp not in parents]
            if not leaves:
                break
            out.append(self.entries.pop(min(leaves)[1]).page)
        return out


@dataclass
class Req:
    tokens: list[int]
    key: str | None
    pages: list[int]  # page table: tree pages then its own
    own: set[int]  # pages it must free (not yet handed to the cache)
    node: Node
    prefix: tuple[int, ...]  # tokens of the locked node's path


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = PagePool(16, SPS, layers=1, kv_heads=1, head_dim=1, dtype=torch.float32)
        self.cache = RadixPrefixCache(self.pool, SPS, SROOT)
        self.model = Model()
        self.reqs: dict[str, Req] = {}
        self.made = 0
        self.hash_of: dict[int, bytes] = {}
        self.cache.on_insert.append(lambda h, p, t, parent: self.hash_of.update(zip(p, h)))

    def _evict(self, n: int) -> None:
        expect = self.model.evict(n)
        got = self.cache.evict(n)
        assert got.pages == expect
        assert got.hashes == [self.hash_of[p] for p in got.pages]

    def _relock(self, r: Req, node: Node, prefix: tuple[int, ...]) -> None:
        self.cache.lock(node)
        self.model.lock(r.key or "", prefix, +1)
        self.cache.unlock(r.node)
        self.model.lock(r.key or "", r.prefix, -1)
        r.node, r.prefix = node, prefix

    @precondition(lambda self: len(self.reqs) < 4)
    @rule(tokens=prompts, key=keys)
    def start(self, tokens: list[int], key: str | None) -> None:
        m = self.cache.match(tokens, key)
        assert m.pages == self.model.match(tokens, key or "")
        assert m.hashes == hash_pages(tokens[: m.num_tokens], SPS, SROOT, key)
        prefix = tuple(tokens[: m.num_tokens])
        self.cache.lock(m.node)
        self.model.lock(key or "", prefix, +1)
        need = -(-len(tokens) // SPS) - len(m.pages)
        if need > self.pool.num_free:
            self._evict(need - self.pool.num_free)
        new = self.pool.alloc(need)
        if new is None:
            self.cache.unlock(m.node)
            self.model.lock(key or "", prefix, -1)
            return
        self.made += 1
        self.reqs[f"req{self.made}"] = Req(tokens, key, m.pages + new, set(new), m.node, prefix)

    @precondition(lambda self: 0 < len(self.reqs) < 4)
    @rule(data=st.data())
    def start_twin(self, data: st.DataObject) -> None:
        """A second request for a prompt still being computed: the later insert returns duplicates."""
        r = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        self.start(list(r.tokens), r.key)

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def progress(self, data: st.DataObject) -> None:
        """Chunked prefill: cache the first j pages, then use the tree's pages from there on."""
        r = self.reqs[data.draw(st.sampled_from(sorted(self.reqs)))]
        j = data.draw(st.integers(len(r.prefix) // SPS, (len(r.tokens) - 1) // SPS))
        expect = self.model.insert(r.tokens[: j * SPS], r.pages[:j], r.key or "")
        dups = self.cache.insert(r.tokens[: j * SPS], r.pages[:j], r.key)
        assert dups == expect
        self.pool.free(dups)
        r.own -= set(dups) | self.cache.cached_pages()
        m = self.cache.match(r.tokens[: j * SPS + 1], r.key)
        assert len(m.pages) == j
        r.pages[:j] = m.pages
        self._relock(r, m.node, tuple(r.tokens[: j * SPS]))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        r = self.reqs.pop(data.draw(st.sampled_from(sorted(self.reqs))))
        expect = self.model.insert(r.tokens, r.pages, r.key or "")
        dups = self.cache.insert(r.tokens, r.pages, r.key)
        assert dups == expect
        cached = self.cache.cached_pages()
        to_free = [p for p in r.pages if p in r.own and p not in cached]
        assert sorted(to_free) == sorted(dups + r.pages[len(r.tokens) // SPS :])
        self.pool.free(to_free)
        self.cache.unlock(r.node)
        self.model.lock(r.key or "", r.prefix, -1)

    @rule(n=st.integers(0, 6))
    def evict(self, n: int) -> None:
        self._evict(n)

    @rule(tokens=prompts, key=keys)
    def match(self, tokens: list[int], key: str | None) -> None:
        assert self.cache.match(tokens, key).pages == self.model.match(tokens, key or "")

    @rule()
    def reset(self) -> None:
        expect = [kp for kp, e in self.model.entries.items() if not e.lock_ref]
        pages = sorted(self.model.entries.pop(kp).page for kp in expect)
        assert sorted(self.cache.reset()) == pages

    @invariant()
    def consistent(self) -> None:
        self.cache.check_integrity()
        held = {name: sorted(r.own) for name, r in self.reqs.items()}
        self.pool.check_integrity({"cache": sorted(self.cache.cached_pages()), **held})
        assert self.cache.cached_pages() == {e.page for e in self.model.entries.values()}
        assert self.cache.num_evictable_pages == sum(not e.lock_ref for e in self.model.entries.values())


CacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestCacheMachine = CacheMachine.TestCase
