"""Find where JSON values end in model output that may still be growing.

`value_end(text, i)` is the end of the JSON value starting at `text[i]`, or None while it is
incomplete; `object_members(text, i)` walks a (possibly incomplete) object's top-level members and
returns each key with the span of its raw value text, so a tool call's arguments can be handed on
byte for byte as the model wrote them (the next turn's prompt then re-renders the same text).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

_WS = " \t\r\n"
_OPEN = {"{": "}", "[": "]"}


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """End (exclusive) of the JSON string opening at text[i] == '"'."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """End (exclusive) of the JSON value at text[i]; None if the text stops inside it.

    Scalars other than strings end at the next delimiter, so `12` at the very end is incomplete."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in _OPEN:
        stack = [_OPEN[c]]
        j = i + 1
        while j < len(text):
            c = text[j]
            if c == '"':
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if c in _OPEN:
                stack.append(_OPEN[c])
            elif c in "}]":
                if c != stack.pop():
                    return -1  # mismatched bracket: never valid
                if not stack:
                    return j + 1
            j += 1
        return None
    j = i
    while j < len(text) and text[j] not in _WS + ",}]":
        j += 1
    return j if j < len(text) else None


@dataclass(frozen=True)
class Member:
    key: str
    start: int  # where the raw value text begins
    end: int | None  # None: the value is still incomplete


def object_members(text: str, i: int) -> tuple[list[Member], int | None, bool]:
    """Members of the object opening at text[i] == '{': (members so far, end of the object or None,
    ok). ok is False once the text cannot be a JSON object any more."""
    members: list[Member] = []
    j = skip_ws(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            return members, j + 1, True
        if text[j] != '"':
            return members, None, False
        key_end = string_end(text, j)
        if key_end is None:
            return members, None, True
        try:
            key = json.loads(text[j:key_end])
        except ValueError:
            return members, None, False
        j = skip_ws(text, key_end)
        if j >= len(text):
            return members, None, True
        if text[j] != ":":
            return members, None, False
        j = skip_ws(text, j + 1)
        if j >= len(text):
            return members, None, True
        end = value_end(text, j)
        if end == -1:
            return members, None, False
        members.append(Member(key, j, end))
        if end is None:
            return members, None, True
        j = skip_ws(text, end)
        if j < len(text) and text[j] == ",":
            j = skip_ws(text, j + 1)
        elif j < len(text) and text[j] != "}":
            return members, None, False
    return members, None, True
