"""RankCacheIndex: what one rank's prefix cache holds, as the gateway believes it.

Exact mode: the set of int64 block hashes fed by the rank's KV events (BlockStored adds,
BlockRemoved removes, AllBlocksCleared empties). Approximate mode, for a rank that publishes no
events: the page hashes of the prompts the gateway sent it, forgetting the least recently routed
beyond `capacity` pages (the rank's pool size), much as the rank's LRU would.

Page hashes chain (h_i names the whole prefix up to page i), so the match of a prompt is the
leading run of its page hashes present here. Thread-safe: the event thread writes, the gateway's
event loop reads.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from kvstrata.kv.event_wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch


class RankCacheIndex:
    def __init__(self, exact: bool, capacity: int = 1 << 20) -> None:
        self.exact = exact  # fed by KV events; else approximate, fed by add_routed
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self) -> set[int]:
        with self._lock:
            return set(self._blocks)

    def apply(self, batch: EventBatch) -> None:
        with self._lock:
            for ev in batch.events:
                if isinstance(ev, BlockStored):
                    self._blocks.update(dict.fromkeys(ev.block_hashes))
                elif isinstance(ev, BlockRemoved):
                    for h in ev.block_hashes:
                        self._blocks.pop(h, None)
                elif isinstance(ev, AllBlocksCleared):
                    self._blocks.clear()

    def clear(self) -> None:
        """The rank restarted or went down: it holds nothing we know of."""
        with self._lock:
            self._blocks.clear()

    def match_pages(self, hashes: list[int]) -> int:
        """How many leading pages of a prompt (its page hashes, in order) this rank holds."""
        with self._lock:
            n = 0
            for h in hashes:
                if h not in self._blocks:
                    break
                n += 1
            if not self.exact:  # approximate: a match is a use, as in the rank's LRU
                for h in hashes[:n]:
                    self._blocks.move_to_end(h)
            return n

    def add_routed(self, hashes: list[int]) -> None:
        """Approximate mode only: the prompt's pages will be on this rank once it has run."""
        with self._lock:
            if self.exact:
                return
            for h in hashes:
                self._blocks[h] = None
                self._blocks.move_to_end(h)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
