"""Compiled grammars, kept by their text and compiled off the engine thread.

Building a matcher compiles its grammar (llguidance drops the GIL while it does: 10-1000 ms by the
schema), and a fresh matcher's first token mask also builds its lexer (~10 ms). Done on the engine
thread, the first constrained request stalled every running stream for that long. Here
`matcher(grammar)` runs in the caller's thread (AsyncEngine calls it in `COMPILE_THREAD`, before
the request reaches the engine): the first time a grammar is seen it is compiled, its first mask
computed, and the matcher kept in an LRU; every request then gets a deep copy (microseconds)
that starts warm. Agents resend the same tools and schemas every turn, so most requests copy.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kvstrata.engine.grammar import GrammarBackend

DEFAULT_SIZE = 128  # distinct grammars kept
COMPILE_THREAD = "kvstrata-grammar"


class GrammarCache:
    def __init__(self, backend: GrammarBackend, size: int = DEFAULT_SIZE) -> None:
        self.backend = backend
        self.size = size
        self.compiled = 0  # grammars compiled (misses), for tests and logs
        self._kept: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for `grammar` (InvalidRequestError if it does not compile). Blocking:
        call it off the engine thread."""
        with self._lock:
            kept = self._kept.get(grammar)
            if kept is not None:
                self._kept.move_to_end(grammar)
        if kept is None:
            kept = self.backend.matcher(grammar)  # raises for a grammar llguidance refuses
            bits = np.zeros(self.backend.mask_words, dtype=np.int32)
            kept.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)  # builds the lexer once, for every copy
            with self._lock:
                self.compiled += 1
                self._kept[grammar] = kept
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        return kept.deep_copy()

    def __len__(self) -> int:
        return len(self._kept)
