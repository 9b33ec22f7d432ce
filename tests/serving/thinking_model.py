"""A tiny random-weight model whose chat template thinks, as Qwen3's thinking models do, and an engine
wrapper that answers with a scripted reply.

THINKING_TEMPLATE: ChatML with Qwen3's tool rendering (<tools>, <tool_call>), assistant turns written
back as `<think>\\n{reasoning_content}</think>\\n\\n{content}`, and a generation prompt that opens
`<think>\\n` (`--reasoning-parser auto` reads it as deepseek_r1: the reply is reasoning until
`</think>`) unless `enable_thinking` is false, which writes the empty `<think>\\n\\n</think>\\n\\n`.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, AsyncIterator

from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.sampling_params import SamplingParams
from serving_support import RecordingEngine

THINKING_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall a function as <tool_call>\\n{\"name\": ..., \"arguments\": {...}}\\n</tool_call>"
    "<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content is defined and message.reasoning_content is not none %}"
    "{{- '<think>\\n' + message.reasoning_content + '</think>\\n\\n' }}{%- endif %}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + "
    "'\", \"arguments\": ' + (call.function.arguments | tojson) + '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


def write_thinking_model(source: Path, out: Path) -> Path:
    """A copy of the model folder `source` with THINKING_TEMPLATE as its chat template."""
    shutil.copytree(source, out)
    (out / "chat_template.jinja").write_text(THINKING_TEMPLATE, encoding="utf-8")
    return out


class ScriptedEngine(RecordingEngine):
    """The real engine's tokenizer and limits, answering every request with the pieces of `reply`
    (one output each, the last finished with "stop"); `prompts` keeps each request's prompt ids."""

    def __init__(self, inner: Any, reply: list[str]) -> None:
        super().__init__(inner)
        self.reply = reply
        self.prompts: list[list[int]] = []

    async def generate(self, request_id: str, ids: list[int], params: SamplingParams) -> AsyncIterator[RequestOutput]:
        self.prompts.append(list(ids))
        for k, piece in enumerate(self.reply):
            last = k == len(self.reply) - 1
            yield RequestOutput(request_id, [0], piece, finished=last, finish_reason="stop" if last else None,
                                prompt_tokens=len(ids), output_tokens=k + 1)
        self.ended[request_id] = "finished"
