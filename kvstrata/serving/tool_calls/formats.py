"""Tool-call formats of model families and how to read calls out of (growing) model output.

| `--tool-call-parser` | the model writes                                        | families          |
|----------------------|---------------------------------------------------------|-------------------|
| `hermes`             | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` | Hermes, Qwen2/2.5/3 |
| `llama3_json`        | `{"name": ..., "parameters": {...}}` (after an optional `<|python_tag|>`; `;` between calls) | Llama 3.1/3.2 |
| `json`               | `{"name": ..., "arguments": {...}}` as the whole reply  | templates with no tool syntax (SmolLM2) |

`auto` picks from the chat template (`pick_format`). `parse(fmt, text, final)` reads what is
certain so far: the content before the calls and each call's name and raw argument text. The
raw text is kept byte for byte, so the next turn re-renders exactly what the model wrote.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from kvstrata.serving.tool_calls.json_scan import object_members, skip_ws

PARSER_NAMES = ("auto", "hermes", "llama3_json", "json")
NAME_KEY = "name"
ARG_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    start: str = ""  # written before each call; "" = the reply itself opens with the JSON object
    end: str = ""  # written after each call
    lead: str = ""  # optional marker once before the calls
    separator: str = "\n"  # between calls, when we render several
    args_key: str = "arguments"  # the key this family writes (both are read)

    def render_call(self, name: str, arguments: str) -> str:
        """One call as this family writes it; `arguments` is raw JSON text, kept as it is."""
        return f'{self.start}{{"name": {json.dumps(name, ensure_ascii=False)}, "{self.args_key}": {arguments}}}{self.end}'


FORMATS = {
    "hermes": ToolCallFormat("hermes", start="<tool_call>\n", end="\n</tool_call>"),
    "llama3_json": ToolCallFormat("llama3_json", lead="<|python_tag|>", separator="; ", args_key="parameters"),
    "json": ToolCallFormat("json"),
}


def pick_format(parser: str, template_source: str | None) -> ToolCallFormat:
    """`--tool-call-parser`; `auto` reads the chat template for a family's tool syntax."""
    if parser != "auto":
        return FORMATS[parser]
    src = template_source or ""
    if "<tool_call>" in src:
        return FORMATS["hermes"]
    if "<|python_tag|>" in src or ("<|eot_id|>" in src and '"parameters"' in src):
        return FORMATS["llama3_json"]
    return FORMATS["json"]


def template_renders_tools(template_source: str | None) -> bool:
    """Whether the template reads `tools` (and so renders tool definitions and calls itself)."""
    return bool(template_source) and "tools" in template_source  # type: ignore[operator]


@dataclass
class PartialCall:
    name: str | None  # None until the name string is complete
    arguments: str  # the raw argument text so far (a prefix of the final text)
    done: bool = False


@dataclass
class Parsed:
    content: str  # text that is surely content, not a call
    calls: list[PartialCall] = field(default_factory=list)
    valid: bool = True  # False: the text cannot be tool calls of this format; it is all content


def _partial_marker(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def _call(text: str, i: int) -> tuple[PartialCall, int | None, bool]:
    """The call object at text[i]: (call so far, end or None while incomplete, ok). Not ok: the
    object cannot be a call (another key, a name that is not a string, arguments not an object)."""
    call = PartialCall(None, "")
    if text[i] != "{":
        return call, None, False
    members, end, ok = object_members(text, i)
    for m in members:
        if m.key not in (NAME_KEY, *ARG_KEYS):
            return call, None, False  # a JSON answer, not a call
        if m.key == NAME_KEY and m.end is not None:
            try:
                name = json.loads(text[m.start:m.end])
            except ValueError:
                return call, None, False
            if not isinstance(name, str) or not name:
                return call, None, False
            call.name = name
        elif m.key in ARG_KEYS:
            if text[m.start] != "{":
                return call, None, False
            call.arguments = text[m.start:m.end if m.end is not None else len(text)]
    if end is not None:
        call.done = call.name is not None and any(m.key in ARG_KEYS for m in members)
        ok = ok and call.done
    return call, end, ok


def parse(fmt: ToolCallFormat, text: str, final: bool) -> Parsed:
    """The calls in `text` so far; with `final`, anything not a complete call makes it all content."""
    pos = 0
    if fmt.start:
        idx = text.find(fmt.start.strip())
        if idx < 0:
            return Parsed(text if final else text[: len(text) - _partial_marker(text, fmt.start.strip())])
        out, pos = Parsed(text[:idx]), idx
    else:
        out = Parsed("")
        pos = skip_ws(text, 0)
        rest = text[pos:]
        if fmt.lead and rest.startswith(fmt.lead):
            pos = skip_ws(text, pos + len(fmt.lead))
        elif fmt.lead and rest and fmt.lead.startswith(rest) and not final:
            return out
        if pos >= len(text):
            return Parsed(text) if final else out
        if text[pos] != "{":
            return Parsed(text)
    start, end_marker = fmt.start.strip(), fmt.end.strip()
    while True:
        pos = skip_ws(text, pos)
        if pos >= len(text):
            break
        if start:
            if not text.startswith(start, pos):
                if start.startswith(text[pos:]) and not final:
                    break
                return Parsed(text, valid=False)
            pos = skip_ws(text, pos + len(start))
            if pos >= len(text):
                break
        elif out.calls and text[pos] in fmt.separator.strip():
            pos = skip_ws(text, pos + 1)
            continue
        call, end, ok = _call(text, pos)
        if not ok:
            return Parsed(text, valid=False)
        out.calls.append(call)
        if end is None:
            break
        pos = skip_ws(text, end)
        if end_marker:
            if text.startswith(end_marker, pos):
                pos += len(end_marker)
            elif pos < len(text) and end_marker.startswith(text[pos:]) and not final:
                break  # the end marker is still arriving
            elif pos < len(text):
                return Parsed(text, valid=False)
    if final and not (out.calls and all(c.done for c in out.calls)):
        return Parsed(text, valid=False)
    return out
