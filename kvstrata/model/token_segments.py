"""Tokenizing an agent's prompt a segment at a time, the segments it resends each turn from a cache.

An agent's request renders to tens of KB of text (system prompt, tool schemas, the history) of which
only the tail is new. `tokenizers` cuts a text at its added special tokens (`<|im_start|>`, ...) before
it normalizes and pre-tokenizes anything, so the ids of a text are the ids of the pieces between those
tokens, each tokenized alone, with the special tokens' ids between them. Here a long text is cut the
same way, and each piece's ids come from an LRU of recent pieces, or else from the tokenizer: a later
turn tokenizes its new messages only.

Only special tokens the tokenizer matches as they are written qualify as cut points: those that strip
no whitespace beside them, match inside words too and are not normalized (an `lstrip`/`rstrip` token
would take the whitespace next to it, which a cut would leave in a piece). A tokenizer without such
tokens is never cut.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

MIN_CHARS = 4096  # shorter texts are tokenized whole: a cut and lookups would cost more than they save
CACHE_CHARS = 4 << 20  # the pieces kept, in characters of text


class SegmentCache:
    def __init__(self, backend: Any) -> None:  # tokenizers.Tokenizer
        self.backend = backend
        self._ids: dict[str, int] = {}
        for token_id, tok in backend.get_added_tokens_decoder().items():
            if tok.special and not (tok.lstrip or tok.rstrip or tok.single_word or tok.normalized) and tok.content:
                self._ids[tok.content] = token_id
        longest_first = sorted(self._ids, key=len, reverse=True)  # as the tokenizer matches them
        self._cut = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if self._ids else None
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0  # distinct pieces served from the cache

    def encode(self, text: str) -> list[int] | None:
        """The text's ids without added special tokens at its ends, or None: not worth cutting (short, or
        the tokenizer has no cut points). Safe from several threads (the server tokenizes in workers)."""
        if self._cut is None or len(text) < MIN_CHARS:
            return None
        parts = self._cut.split(text)  # pieces at even indices, special tokens at odd ones
        table: dict[str, list[int]] = {}
        with self._lock:
            for piece in parts[0::2]:
                if piece and piece not in table and piece in self._pieces:
                    self._pieces.move_to_end(piece)
                    table[piece] = self._pieces[piece]
            self.hits += len(table)
        missing = [p for p in dict.fromkeys(parts[0::2]) if p and p not in table]
        if missing:  # one call for all new pieces (encode_batch releases the GIL)
            encoded = self.backend.encode_batch(missing, add_special_tokens=False)
            with self._lock:
                for piece, enc in zip(missing, encoded):
                    table[piece] = enc.ids
                    self._keep(piece, enc.ids)
        out: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                out.append(self._ids[part])
            elif part:
                out.extend(table[part])
        return out

    def _keep(self, piece: str, ids: list[int]) -> None:
        if len(piece) > CACHE_CHARS or piece in self._pieces:  # too big to keep, or another thread kept it
            return
        self._pieces[piece] = ids
        self._chars += len(piece)
        while self._chars > CACHE_CHARS:
            old, _ = self._pieces.popitem(last=False)
            self._chars -= len(old)
