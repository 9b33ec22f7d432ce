"""Where a request stops matching the request it should reuse, and which pattern moved it.

`find_divergence(request, reference)` compares token ids: the first token where they differ,
before the end of what should have been shared, is a divergence. `classify` then compares the two
requests' structure (tools, the message and field the token sits in) to name the moving part:

| pattern          | seen as                                                                   |
|------------------|---------------------------------------------------------------------------|
| volatile_id      | the first differing characters are a digit or hex run (timestamp, id)     |
| tools_reordered  | same tools (field or lines of the system prompt), another order           |
| tools_changed    | the `tools` field differs in content                                      |
| template_history | both requests hold the same messages, yet the template renders them apart |
| reasoning_dropped| an earlier assistant message lost its reasoning_content                   |
| content_edited   | the client changed an earlier message's text                              |
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from kvstrata.analyze.grouping import Reference
from kvstrata.analyze.rendered import REASONING_FIELDS, Location, Rendered

_ID_CHARS = re.compile(r"[0-9A-Fa-f:\-.TZ+_/]")
ADVICE = {
    "volatile_id": "A value that changes every request (a timestamp, date or request id) sits in the prompt; "
                   "every token after it is recomputed. Move it to the end of the last message, drop it, or "
                   "round it (a date instead of a time).",
    "tools_reordered": "The tool definitions arrive in a different order per request. Sort them once (by name) "
                       "and send the same order every time.",
    "tools_changed": "The tool list changes between requests of one agent. Keep one fixed tool set per agent "
                     "(disable tools in the instructions rather than removing them).",
    "template_history": "The chat template renders an earlier message differently once it is no longer the last "
                        "one, so the history is rewritten every turn. Use a template that renders history the same "
                        "every turn (serve --chat-template, or fix the template's loop.last / turn-number branches).",
    "reasoning_dropped": "An earlier assistant message is sent back without its reasoning_content, so the history "
                         "changes under the cache. Send reasoning_content back unchanged, or have the template drop "
                         "reasoning from every turn consistently.",
    "content_edited": "The client edits earlier messages (truncation, summarisation, re-formatting). Append to "
                      "the history instead of rewriting it; summarise rarely and at a fixed point.",
}


@dataclass(frozen=True)
class Divergence:
    request: int
    reference: int
    reference_kind: str  # "session" or "agent"
    token_offset: int  # first differing token of the request
    lost_tokens: int  # tokens of the reference that should have been reused and were not
    location: Location  # where the differing token sits in the request
    pattern: str  # a key of ADVICE
    detail: str  # what moved, in words
    before: str  # text around the divergence in the reference
    after: str  # ... and in the request

    @property
    def advice(self) -> str:
        return ADVICE[self.pattern]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _context(r: Rendered, char: int, width: int = 40) -> str:
    return (r.text[max(0, char - width):char] + "⟦" + r.text[char:char + width]).replace("\n", "\\n")


def _first_char_diff(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _id_run(text: str, at: int) -> str:
    lo, hi = at, at
    while lo > 0 and _ID_CHARS.match(text[lo - 1]):
        lo -= 1
    while hi < len(text) and _ID_CHARS.match(text[hi]):
        hi += 1
    return text[lo:hi]


def _looks_volatile(run: str) -> bool:
    digits = sum(c.isdigit() for c in run)
    return digits >= 4 or (len(run) >= 8 and all(c in "0123456789abcdefABCDEF-" for c in run) and digits >= 2)


def _tool_names(tools: list[object] | None) -> list[str]:
    return [json.dumps(t, sort_keys=True) for t in tools or []]


def _same_lines_reordered(a: str, b: str) -> bool:
    return a != b and sorted(a.splitlines()) == sorted(b.splitlines())


def classify(request: Rendered, reference: Rendered, location: Location) -> tuple[str, str]:
    """(pattern, detail) for a divergence at `location` of `request`."""
    if request.tools != reference.tools and (request.tools or reference.tools):
        if sorted(_tool_names(request.tools)) == sorted(_tool_names(reference.tools)):
            return "tools_reordered", "the `tools` field lists the same tools in another order"
        return "tools_changed", "the `tools` field differs"
    i = location.message
    if i is None:  # markup (a role header, a separator): it belongs to the next message
        i = min((s.message for s in request.spans if s.start >= location.offset), default=len(request.messages) - 1)
    for field in REASONING_FIELDS:
        old, new = reference.field(i, field), request.field(i, field)
        if old and not new:
            return "reasoning_dropped", f"message {i} (assistant) was re-sent without its {field}"
    field = location.field or "content"
    old, new = reference.field(i, field), request.field(i, field)
    if old is None or new is None or old == new:
        return "template_history", (
            f"message {i} ({location.role or request.messages[min(i, len(request.messages) - 1)].get('role')}) "
            "is the same in both requests but renders differently"
        )
    at = _first_char_diff(old, new)
    run_old, run_new = _id_run(old, at), _id_run(new, at)
    if _looks_volatile(run_old) or _looks_volatile(run_new):
        role = request.messages[i].get("role")
        return "volatile_id", f"{run_old!r} -> {run_new!r} at char {at} of message {i} ({role}) {field}"
    if _same_lines_reordered(old, new):
        moved = "tool definitions" if "<tools>" in new or '"name"' in new else "lines"
        pattern = "tools_reordered" if moved == "tool definitions" else "content_edited"
        return pattern, f"the {moved} of message {i} {field} are the same lines in another order"
    return "content_edited", f"message {i} {field} changed at char {at}"


def find_divergence(request: Rendered, reference: Rendered, ref: Reference) -> Divergence | None:
    shared = min(ref.shared_tokens, len(reference.ids))
    common = common_prefix(request.ids, reference.ids)
    if common >= shared:
        return None
    char = request.char_of_token(common)
    location = request.locate(char)
    pattern, detail = classify(request, reference, location)
    return Divergence(
        request.index, reference.index, ref.kind, common, shared - common, location, pattern, detail,
        _context(reference, reference.char_of_token(common)), _context(request, char),
    )
