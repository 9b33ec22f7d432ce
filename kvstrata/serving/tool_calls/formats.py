"""Tool-call formats of model families and how to read calls out of (growing) model output.

| `--tool-call-parser` | the model writes                                        | families          |
|----------------------|---------------------------------------------------------|-------------------|
| `hermes`             | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` | Hermes, Qwen2/2.5/3 |
| `llama3_json`        | `{"name": ..., "parameters": {...}}` (after an optional `<|python_tag|>`; `;` between calls) | Llama 3.1/3.2 |
| `json`               | `{"name": ..., "arguments": {...}}` as the whole reply  | templates with no tool syntax (SmolLM2) |

`auto` picks from the chat template (`pick_format`). parser.py reads calls out of a reply in
these formats; the raw argument text is kept byte for byte, so the next turn re-renders exactly
what the model wrote.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

PARSER_NAMES = ("auto", "hermes", "llama3_json", "json")


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
