"""Reasoning ("thinking") in replies: which parser reads it, and splitting it from the content.

| `--reasoning-parser` | the reply                                                    | families    |
|----------------------|--------------------------------------------------------------|-------------|
| `qwen3`              | `<think>reasoning</think>content` if it opens with `<think>` | Qwen3, QwQ  |
| `deepseek_r1`        | `reasoning</think>content` (the prompt opened `<think>`)     | DeepSeek-R1 |
| `none`               | all content                                                  |             |

qwen3 allows whitespace before the opening `<think>`; deepseek_r1 (also Qwen3's 2507 thinking
models, whose template opens `<think>` itself) drops a leading `<think>`.

`auto` reads the chat template (`resolve_reasoning_parser`): none without `<think>`, `deepseek_r1`
when its generation prompt itself ends with `<think>`, else `qwen3`. Content after `</think>` loses its
leading newlines, as vLLM's parsers do. A reply that never closes `</think>` (cut by max_tokens) is all
reasoning, streamed or not: a stream cannot take back what it sent, so the whole reply agrees with it.
`split_reasoning` of a whole reply equals `ReasoningSplitter.feed` over any chunking of it. Requests
turn thinking off (`enable_thinking: false`, reasoning effort "none"), and a constrained reply (a
forced tool call, a response_format schema) is all content: its grammar holds from the first token
(prepare.py's `reply_reasoning`). Tool calls are read from the content only.
"""
from __future__ import annotations

import functools

REASONING_PARSERS = ("auto", "qwen3", "deepseek_r1", "none")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def resolve_reasoning_parser(flag: str, chat_template_source: str | None) -> str | None:
    """The parser replies are read with; None: replies are all content."""
    if flag == "none":
        return None
    if flag != "auto":
        return flag
    if not chat_template_source or THINK_OPEN not in chat_template_source:
        return None
    return "deepseek_r1" if _generation_prompt_opens_think(chat_template_source) else "qwen3"


@functools.lru_cache(maxsize=8)
def _generation_prompt_opens_think(source: str) -> bool:
    """Whether the template's generation prompt ends with `<think>` (rendered for one user message:
    the text add_generation_prompt adds). A template that cannot render alone falls back to reading
    its source for `<think>\\n` that is not the empty `<think>\\n\\n</think>` of thinking turned off."""
    from kvstrata.model.chat_template import ChatTemplate

    try:
        template = ChatTemplate(source, {})
        user = [{"role": "user", "content": "x"}]
        with_prompt = template.render(user, add_generation_prompt=True)
        without = template.render(user, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template that needs more than one user message: read its source
        text = source.replace("\\n", "\n")
        return text.count("<think>\n") > text.count("<think>\n\n</think>")
    return with_prompt.startswith(without) and with_prompt[len(without):].rstrip().endswith(THINK_OPEN)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `tag` (held back)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """One streamed reply: text pieces in, (reasoning delta, content delta) out.

    States: "start" (the opening not yet known: held back while it may still become `<think>`),
    "reasoning" (until `</think>`; a possible partial tag at the end is held back), "after" (newlines
    right after `</think>` dropped), "content".
    """

    def __init__(self, kind: str) -> None:
        if kind not in ("qwen3", "deepseek_r1"):
            raise ValueError(f"unknown reasoning parser {kind!r}; one of qwen3, deepseek_r1")
        self.kind = kind
        self.state = "start"
        self.held = ""

    @property
    def thinking(self) -> bool:
        """Whether text fed next would be reasoning (callers count the tokens sampled meanwhile)."""
        return self.state == "reasoning" or (self.state == "start" and self.kind == "deepseek_r1")

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        self.held += text
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            if self.state == "start":
                opening = self.held.lstrip()
                if opening.startswith(THINK_OPEN):
                    self.held, self.state = opening[len(THINK_OPEN):], "reasoning"
                elif THINK_OPEN.startswith(opening) and not final:
                    break  # "", "  <thi": may still open the tag
                else:
                    self.state = "reasoning" if self.kind == "deepseek_r1" else "content"
            elif self.state == "reasoning":
                at = self.held.find(THINK_CLOSE)
                if at < 0:
                    keep = 0 if final else _partial_suffix(self.held, THINK_CLOSE)
                    reasoning.append(self.held[:len(self.held) - keep])
                    self.held = self.held[len(self.held) - keep:]
                    break
                reasoning.append(self.held[:at])
                self.held, self.state = self.held[at + len(THINK_CLOSE):], "after"
            elif self.state == "after":
                self.held = self.held.lstrip("\n")
                if not self.held:
                    break
                self.state = "content"
            else:
                content.append(self.held)
                self.held = ""
                break
        return "".join(reasoning), "".join(content)


def split_reasoning(kind: str | None, text: str) -> tuple[str | None, str]:
    """(reasoning, content) of a whole reply; reasoning is None when `kind` is None or the reply
    has none."""
    if kind is None:
        return None, text
    reasoning, content = ReasoningSplitter(kind).feed(text, final=True)
    return reasoning or None, content
