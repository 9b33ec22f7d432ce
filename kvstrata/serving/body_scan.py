"""Checks of a raw JSON request body before it is parsed, each linear in the body with a small constant.

`scan_body(body)` answers, in a few vectorised passes (`bytes.replace` and numpy, no regular
expression that could backtrack, no Python work per byte or per match):
- `depth`: the deepest nesting of arrays and objects (brackets inside strings ignored, unclosed
  ones counted as open);
- `non_finite`: a `NaN`/`Infinity` literal outside strings (Python's json reads them, JSON and
  OpenAI do not, and no reply could serialise one back);
- `lone_surrogate`: a string escaping half a UTF-16 surrogate pair (`"\\ud800"`) or carrying a
  surrogate's UTF-8 bytes (`ED A0 80`, which Python's json reads as `\\ud800`): no UTF-8 text can
  hold it, so tokenizers and hashes would fail on it.
An 8 MiB body costs tens of milliseconds. (The regex this replaces, `"(?:[^"\\]|\\.)*"`, rescanned
to the end of the body from every quote of an unterminated string: 160 KB of `\\"` took minutes.)

Strings without a parser: in a run of backslashes the escapes pair from the left (`\\\\` is one
escaped backslash), which is what `bytes.replace` does, left to right without overlap. With the
backslash pairs and then the escaped quotes replaced, every remaining `"` opens or closes a string,
so a byte is inside a string when an odd number of quotes precede it (a running XOR).
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_MARKS = b'"[]{}NI'
_UNMARKED = bytes(b for b in range(256) if b not in _MARKS)
_IS_MARK = np.zeros(256, bool)
_IS_MARK[list(_MARKS)] = True
_KEY_BEFORE = re.compile(rb'"([A-Za-z0-9_.-]{1,64})"\s*:\s*-?\Z')  # `"max_tokens": ` right before a value
_STEP = np.zeros(256, np.int8)  # how a byte changes the nesting depth
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")  # UTF-8 bytes of U+D800-U+DFFF (CESU-8)
_PAIR = 6  # a surrogate escape's length: the low half of a pair starts 6 bytes after the high half


class BodyScan(NamedTuple):
    depth: int
    non_finite: bool
    lone_surrogate: bool


def scan_body(body: bytes) -> BodyScan:
    unpaired = body.replace(b"\\\\", b"__")  # every backslash left starts an escape
    # the bytes that matter, in order (quotes decide which of the others are inside strings): a
    # prompt-sized body shrinks to a few thousand bytes before numpy sees it
    marks = np.frombuffer(unpaired.replace(b'\\"', b"__").translate(None, _UNMARKED), np.uint8)
    outside = np.bitwise_xor.accumulate(marks == _QUOTE) == 0  # quotes themselves land either way: no matter
    depth = int(np.cumsum(np.where(outside, _STEP[marks], 0), dtype=np.int32).max(initial=0))
    # outside strings JSON has no letters but those of true, false and null: an N or I is NaN or Infinity
    non_finite = bool(np.any(outside & ((marks == ord("N")) | (marks == ord("I")))))
    return BodyScan(depth, non_finite, _has_lone_surrogate(body, unpaired))


def non_finite_key(body: bytes) -> str | None:
    """The key whose value is the first NaN/Infinity literal outside strings, when the body writes
    it as `"key": NaN` (for the error's param); None otherwise. Linear, for the refusal path only."""
    text = np.frombuffer(body.replace(b"\\\\", b"__").replace(b'\\"', b"__"), np.uint8)  # lengths kept
    where = np.flatnonzero(_IS_MARK[text])
    marks = text[where]
    outside = np.bitwise_xor.accumulate(marks == _QUOTE) == 0
    found = np.flatnonzero(outside & ((marks == ord("N")) | (marks == ord("I"))))
    if not len(found):
        return None
    at = int(where[found[0]])
    key = _KEY_BEFORE.search(body, max(0, at - 256), at)
    return key.group(1).decode() if key else None


def _has_lone_surrogate(body: bytes, unpaired: bytes) -> bool:
    if b"\xed" in body and _ENCODED_SURROGATE.search(body):
        return True
    if b"\\ud" not in unpaired and b"\\uD" not in unpaired:  # memchr-fast, where a regex search is not
        return False
    n = len(unpaired)
    b = np.frombuffer(unpaired + bytes(5), np.uint8)  # padded: an escape may start at any of the n bytes
    third = b[3:3 + n] | 0x20  # lower case (digits keep their codes)
    escape = (b[:n] == _BACKSLASH) & (b[1:1 + n] == ord("u")) & ((b[2:2 + n] | 0x20) == ord("d"))
    high = escape & np.isin(third, np.frombuffer(b"89ab", np.uint8))
    low = escape & (third >= ord("c")) & (third <= ord("f"))
    followed = np.zeros(n, bool)
    followed[:-_PAIR] = low[_PAIR:]  # a low half right after this position's escape
    preceded = np.zeros(n, bool)
    preceded[_PAIR:] = high[:-_PAIR]
    return bool(np.any(high & ~followed) or np.any(low & ~preceded))


def json_depth(body: bytes) -> int:
    return scan_body(body).depth


def has_non_finite(body: bytes) -> bool:
    return scan_body(body).non_finite


def has_lone_surrogate(body: bytes) -> bool:
    return scan_body(body).lone_surrogate
