"""`IncrementalDetokenizer`: token ids in, text deltas out, for streaming.

Decoding one token at a time is wrong twice over: a byte-level token may hold half a UTF-8
character (an emoji split over two tokens decodes to U+FFFD), and sentencepiece decoders drop or
add a leading space depending on what comes before. So each step decodes a short window
`ids[prefix_offset:]` and emits what it adds over `ids[prefix_offset:read_offset]`; a result that
ends in U+FFFD is held back until the bytes that complete it arrive.

    ids:  ... | prefix_offset ........ read_offset ........ len(ids)
                 (context, emitted)     (new, not yet emitted)
"""
from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 5  # prompt tokens decoded as context before the first generated one


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: _Decoder, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_ids or [])
        self._read_offset = len(self._ids)
        self._prefix_offset = max(0, self._read_offset - _CONTEXT_TOKENS)
        self._text_parts: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far (held-back bytes excluded)."""
        return "".join(self._text_parts)

    def feed(self, token_id: int) -> str:
        """Add one generated token; return the text it completes ("" while a character is partial)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or an incomplete UTF-8 sequence: wait for more bytes
        delta = new_text[len(prefix_text):]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._text_parts.append(delta)
        return delta

    def flush(self) -> str:
        """At the end of generation: whatever is still held back (it may contain U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        delta = new_text[len(prefix_text):] if new_text.startswith(prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        if delta:
            self._text_parts.append(delta)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""
