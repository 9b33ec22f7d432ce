"""Achievable cached tokens: whole pages of each request's prompt that the server already held.

Achievable cached tokens of a request = the longest prefix of its prompt, in whole pages, that the
server already held when the request was sent, never counting the last prompt token (a server must
recompute it to produce logits). "Held" means tokens of earlier requests the server had computed
KV for, replayed from the client's clock:
- an earlier request's prompt counts from its first content token (its prefill was done then);
- its reply counts from the end of its stream, as `tokenize(reply text)`: the reply sits between
  the assistant header and the end-of-turn token in the next turn's rendered prompt, both token
  boundaries, so these ids are exactly what the next turn re-sends. When the reply was cut by
  `max_tokens` (finish_reason != "stop"), its last token is dropped: the last sampled token is
  never fed through the model, so no server holds its KV. (On "stop" the last sampled token is
  the end-of-turn token, which is not in the text.)
Prompts are rendered with the model's chat template and tokenized locally; `prompt_tokens_mismatch`
counts requests whose local count differs from the server's `usage.prompt_tokens` (a different
template or tokenizer, which makes the achievable figure wrong for that peer).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kvstrata.bench.client import RequestRecord


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A tokenizer with its chat template from a .gguf file or a Hugging Face folder (cached)."""
    from transformers import AutoTokenizer  # heavy: import only when a report needs it

    p = Path(path).expanduser()
    if p.suffix == ".gguf" and not p.is_file():
        raise FileNotFoundError(
            f"no tokenizer at {p}: pass --tokenizer (a .gguf file or a Hugging Face tokenizer folder)"
            " or fetch the default model with `kvstrata fetch-model smollm2`"
        )
    if p.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return AutoTokenizer.from_pretrained(str(p) if p.exists() else path)


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """The ids a server sees: the chat template rendered with the generation prompt, tokenized."""
    if not tokenizer.chat_template:
        raise ValueError("the --tokenizer has no chat template; pass the model's own tokenizer")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


class PrefixLedger:
    """Every full page of every sequence added, as a trie keyed by (parent node, page tokens).

    Keys hold the tokens themselves (not a hash of them), so a match can never be a collision.
    """

    def __init__(self, page_size: int) -> None:
        if page_size < 1:
            raise ValueError("--page-size must be >= 1")
        self.page_size = page_size
        self._nodes: dict[tuple[int, tuple[int, ...]], int] = {}

    def add(self, tokens: Sequence[int]) -> None:
        parent = 0
        for start in range(0, len(tokens) - self.page_size + 1, self.page_size):
            key = (parent, tuple(tokens[start : start + self.page_size]))
            parent = self._nodes.setdefault(key, len(self._nodes) + 1)

    def match(self, prompt: Sequence[int]) -> int:
        """Tokens of the longest held page-aligned prefix, leaving out the last token (read-only)."""
        parent, matched = 0, 0
        while matched + self.page_size <= len(prompt) - 1:
            node = self._nodes.get((parent, tuple(prompt[matched : matched + self.page_size])))
            if node is None:
                break
            parent, matched = node, matched + self.page_size
        return matched


@dataclass(frozen=True)
class SentSequence:
    prompt_ids: list[int]
    completion_ids: list[int]  # reply tokens whose KV the server computed
    t_sent: float
    t_prompt_held: float | None  # from when the server held the prompt's KV; None = never
    t_done: float | None  # from when it held prompt + completion; None = failed


def achievable_tokens(sequences: Sequence[SentSequence], page_size: int) -> list[int]:
    """Achievable cached tokens of each sequence (see the module docstring), in input order."""
    events: list[tuple[float, int, int, str]] = []  # (time, order, index, kind)
    for i, s in enumerate(sequences):
        events.append((s.t_sent, 1, i, "send"))
        for t, kind in ((s.t_prompt_held, "prompt"), (s.t_done, "done")):
            if t is not None:  # held before other sends at the same time, never before its own
                events.append((max(t, s.t_sent), 0 if t > s.t_sent else 2, i, kind))
    ledger = PrefixLedger(page_size)
    out = [0] * len(sequences)
    for _, _, i, kind in sorted(events):
        s = sequences[i]
        if kind == "send":
            out[i] = ledger.match(s.prompt_ids)
        elif kind == "prompt":
            ledger.add(s.prompt_ids)
        else:
            ledger.add(s.prompt_ids + s.completion_ids)
    return out


def sent_sequence(record: RequestRecord, tokenizer: PreTrainedTokenizerBase) -> SentSequence:
    """A request as local token ids, with when the server held its prompt and its reply."""
    r = record.result
    completion: list[int] = []
    if r.ok:
        completion = list(tokenizer.encode(r.text, add_special_tokens=False))
        if r.finish_reason != "stop":
            completion = completion[:-1]
    t_prompt = r.t_sent + r.ttft_s if r.ttft_s is not None else (r.t_done if r.ok else None)
    prompt = prompt_token_ids(tokenizer, record.messages)
    return SentSequence(prompt, completion, r.t_sent, t_prompt, r.t_done if r.ok else None)
