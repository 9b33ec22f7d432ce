"""ToolCallParser: the tool calls, and the content around them, of a reply that is still growing.

One parser decides for streamed and whole replies (a whole reply is one feed with `final`), and
its decisions depend only on the text, never on where the stream cut it, so a stream and the same
reply answered at once agree. Each feed reads only the new text (`CallScan` keeps its place inside
a call): a reply costs linear time however finely it streams.

Rules, per format (formats.py):
- with a start marker (hermes): text before a `<tool_call>` is content; each marker opens one call
  object, closed by `</tool_call>`; text after it is content again;
- without (json, llama3_json): the reply opens, after whitespace and the optional lead, with a call
  object, or it is all content; calls follow each other (llama3: `;` between); text after the
  last call is content;
- whitespace right after a call is dropped;
- a call counts once its name is read and its arguments have opened with `{` (a stream sends its
  header then): if its object turns out not to be a call after that, it ends there with the
  arguments read so far and the text from that point is content; a call that fails earlier is
  content from where it began (for a format without markers, the first call's failure makes the
  whole reply content);
- when the reply ends inside a named call, the call stays, with its arguments cut (as OpenAI
  answers at max_tokens); a marker held back while it could still be a marker is content.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvstrata.serving.tool_calls.formats import ToolCallFormat
from kvstrata.serving.tool_calls.json_scan import CallScan, skip_ws

# what the parser expects next
_LEAD, _CONTENT, _OPEN, _CALL, _CLOSE, _SKIP_WS, _BETWEEN, _REST = range(8)


@dataclass
class PartialCall:
    name: str
    arguments: str  # the raw argument text so far (a prefix of the final text)
    done: bool = False


class ToolCallParser:
    def __init__(self, fmt: ToolCallFormat) -> None:
        self.fmt = fmt
        self.start, self.end = fmt.start.strip(), fmt.end.strip()
        self.separator = fmt.separator.strip()
        self.text = ""
        self.pos = 0  # the first character not yet decided
        self.mode = _CONTENT if self.start else _LEAD
        self.after_ws = _CONTENT  # the mode once the whitespace after a call is skipped
        self.unit_start = 0  # where the call being read began: its content if it fails unnamed
        self.scan: CallScan | None = None
        self.current: PartialCall | None = None  # the call being read, once it counts
        self.calls: list[PartialCall] = []

    def feed(self, new_text: str, final: bool) -> str:
        """Add `new_text`; return the content it decided (every character is content, part of a
        call, or dropped whitespace, exactly once over the whole reply)."""
        self.text += new_text
        out: list[str] = []
        while self._step(out, final):
            pass
        if final:
            self._finish(out)
        return "".join(out)

    @property
    def complete(self) -> bool:
        """At least one call, and every call whole."""
        return bool(self.calls) and all(c.done for c in self.calls)

    def _rest_from(self, i: int) -> bool:
        self.mode, self.pos = _REST, i
        return True

    def _begin_call(self, i: int) -> bool:
        self.mode, self.pos, self.scan, self.current = _CALL, i, CallScan(i), None
        return True

    def _step(self, out: list[str], final: bool) -> bool:
        """Decide what the text at `pos` is; False when that needs more text."""
        text, mode = self.text, self.mode
        if mode == _REST:
            out.append(text[self.pos:])
            self.pos = len(text)
            return False
        if mode == _CALL:
            return self._read_call()
        if mode == _CONTENT:
            found = text.find(self.start, self.pos)
            if found < 0:
                keep = len(text) - _partial_marker(text, self.start)
                out.append(text[self.pos:keep])
                self.pos = keep
                return False
            out.append(text[self.pos:found])
            self.unit_start, self.pos, self.mode = found, found + len(self.start), _OPEN
            return True
        i = skip_ws(text, self.pos)
        if mode == _SKIP_WS:
            self.pos = i
            if i < len(text):
                self.mode = self.after_ws
            return i < len(text)
        if mode == _LEAD:  # (a failure here makes the whole reply content: `pos` may move on)
            lead = self.fmt.lead
            if lead and text.startswith(lead, i):
                i = skip_ws(text, i + len(lead))
            elif lead and i < len(text) and lead.startswith(text[i:]):
                self.pos = i
                return False  # the lead is still arriving
            self.pos = i
            if i >= len(text):
                return False
            return self._begin_call(i) if text[i] == "{" else self._rest_from(0)
        if i >= len(text):
            return False
        if mode == _OPEN:
            return self._begin_call(i) if text[i] == "{" else self._rest_from(self.unit_start)
        if mode == _CLOSE:
            if text.startswith(self.end, i):
                self.pos, self.mode, self.after_ws = i + len(self.end), _SKIP_WS, _CONTENT
                return True
            if self.end.startswith(text[i:]) and not final:
                return False
            return self._rest_from(i)
        # _BETWEEN: after a call of a format without markers
        if self.separator and text[i] == self.separator:
            self.unit_start, self.pos, self.mode = i, i + 1, _OPEN
            return True
        if text[i] == "{":
            self.unit_start = i
            return self._begin_call(i)
        return self._rest_from(i)

    def _read_call(self) -> bool:
        scan = self.scan
        assert scan is not None
        scan.advance(self.text)
        if scan.name is not None and scan.args_start is not None and self.current is None:
            self.current = PartialCall(scan.name, "")
            self.calls.append(self.current)
        if self.current is not None:
            self.current.arguments = scan.arguments(self.text)
        if scan.done:
            assert self.current is not None and scan.end is not None
            self.current.done = True
            self.pos, self.mode = scan.end, (_CLOSE if self.end else _SKIP_WS)
            self.after_ws = _BETWEEN
            return True
        if scan.failed:
            assert scan.failed_at is not None
            return self._rest_from(scan.failed_at if self.current is not None else self._fallback())
        self.pos = scan.pos
        return False

    def _fallback(self) -> int:
        """Where the content starts when the call being read fails before its name."""
        return 0 if not self.start and not self.calls else self.unit_start

    def _finish(self, out: list[str]) -> None:
        if self.mode == _CONTENT:
            out.append(self.text[self.pos:])  # a held-back marker start that never completed
        elif self.mode == _LEAD:
            out.append(self.text)  # no call began: all content
        elif self.mode == _OPEN:
            out.append(self.text[self.unit_start:])  # a marker (or separator) with no call after it
        elif self.mode == _CALL and self.current is None:
            out.append(self.text[self._fallback():])  # cut before its name: not a call
        self.pos = len(self.text)


def _partial_marker(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0
