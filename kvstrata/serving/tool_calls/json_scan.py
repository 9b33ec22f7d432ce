"""An incremental scan of one tool-call object, `{"name": ..., "arguments": {...}}`, in model output
that is still growing.

`CallScan(start)` is told where the object's `{` is; each `advance(text)` reads only what was
added since the last call (every character is looked at once over the whole reply), so a caller
can feed a reply delta by delta in linear time. It keeps the call's name once its string is
complete and the span of the raw argument text, which is handed on byte for byte as the model
wrote it (the next turn's prompt re-renders the same text). It fails, at the character that
shows it, as soon as the object cannot be a call: another key, a name that is not a string,
arguments that are not an object, brackets that do not match.
"""
from __future__ import annotations

import json
import re

NAME_KEY = "name"
ARG_KEYS = ("arguments", "parameters")
WHITESPACE = " \t\r\n"
_STRING_SPECIAL = re.compile(r'["\\]')
_NESTED_SPECIAL = re.compile(r'["{}\[\]]')
_CLOSER = {"{": "}", "[": "]"}
# states between members
_KEY, _IN_KEY, _COLON, _VALUE, _IN_NAME, _IN_ARGS, _AFTER, _DONE, _FAILED = range(9)


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


class CallScan:
    def __init__(self, start: int) -> None:
        self.start = start  # the object's `{`
        self.pos = start + 1  # the first character not yet read
        self.state = _KEY
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None  # None while the arguments are incomplete
        self.end: int | None = None  # after the closing `}`
        self.failed_at: int | None = None
        self._key = ""
        self._token_start = 0  # where the key or value being read began
        self._stack: list[str] = []  # closers expected inside the arguments
        self._in_string = False

    @property
    def done(self) -> bool:
        return self.state == _DONE

    @property
    def failed(self) -> bool:
        return self.state == _FAILED

    def arguments(self, text: str) -> str:
        """The raw argument text read so far (all of it once the arguments are complete)."""
        if self.args_start is None:
            return ""
        return text[self.args_start:self.args_end if self.args_end is not None else self.pos]

    def advance(self, text: str) -> None:
        while self.pos < len(text) and self.state not in (_DONE, _FAILED):
            before = (self.pos, self.state)
            self.pos = self._step(text, self.pos)
            if (self.pos, self.state) == before:
                return  # waiting for the character a trailing backslash escapes

    def _fail(self, i: int) -> int:
        self.state, self.failed_at = _FAILED, i
        return i

    def _step(self, text: str, i: int) -> int:
        """Read from text[i] (i < len(text)); return where to go on."""
        state = self.state
        if state in (_KEY, _COLON, _VALUE, _AFTER):
            i = skip_ws(text, i)
            if i >= len(text):
                return i
            c = text[i]
            if state == _KEY:
                if c == "}":
                    return self._close(i)
                if c != '"':
                    return self._fail(i)
                self.state, self._token_start = _IN_KEY, i
                return i + 1
            if state == _COLON:
                if c != ":":
                    return self._fail(i)
                self.state = _VALUE
                return i + 1
            if state == _VALUE:
                if self._key == NAME_KEY and c == '"':
                    self.state, self._token_start = _IN_NAME, i
                elif self._key in ARG_KEYS and c == "{":
                    self.state, self.args_start, self._stack = _IN_ARGS, i, ["}"]
                else:
                    return self._fail(i)
                return i + 1
            if c == ",":
                self.state = _KEY
                return i + 1
            return self._close(i) if c == "}" else self._fail(i)
        if state in (_IN_KEY, _IN_NAME):
            end, resume = _string_end(text, i)
            if end is None:
                return resume
            try:
                value = json.loads(text[self._token_start:end])
            except ValueError:
                return self._fail(i)
            if state == _IN_KEY:
                if value not in (NAME_KEY, *ARG_KEYS):
                    return self._fail(self._token_start)  # a JSON answer, not a call
                self.state, self._key = _COLON, value
            elif not value:
                return self._fail(self._token_start)
            else:
                self.state, self.name = _AFTER, value
            return end
        return self._read_arguments(text, i)

    def _read_arguments(self, text: str, i: int) -> int:
        if self._in_string:
            end, resume = _string_end(text, i)
            if end is None:
                return resume
            self._in_string = False
            return end
        m = _NESTED_SPECIAL.search(text, i)
        if m is None:
            return len(text)
        j, c = m.start(), m.group()
        if c == '"':
            self._in_string = True
        elif c in _CLOSER:
            self._stack.append(_CLOSER[c])
        elif c != self._stack.pop():
            return self._fail(j)
        elif not self._stack:
            self.state, self.args_end = _AFTER, j + 1
        return j + 1

    def _close(self, i: int) -> int:
        if self.name is None or self.args_end is None:
            return self._fail(i)  # an object, but not a whole call
        self.state, self.end = _DONE, i + 1
        return i + 1


def _string_end(text: str, i: int) -> tuple[int | None, int]:
    """(after the `"` that closes the string whose body continues at text[i], or None if it has not
    arrived; where to resume reading then: a backslash at the very end is read again with the
    character it escapes)."""
    while True:
        m = _STRING_SPECIAL.search(text, i)
        if m is None:
            return None, len(text)
        if m.group() == '"':
            return m.end(), m.end()
        if m.end() >= len(text):
            return None, m.start()
        i = m.end() + 1
