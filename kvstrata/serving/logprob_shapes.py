"""Logprobs in OpenAI's two shapes: chat's `logprobs.content` and completions' legacy four lists.

- Chat: one `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}` per generated token;
  `top_logprobs` holds the request's `top_logprobs` best (OpenAI's rule).
- Completions: `tokens`, `token_logprobs`, `top_logprobs` (a {token: logprob} dict per token: the
  `logprobs` best and the chosen token, so up to logprobs + 1 entries, OpenAI's rule), `text_offset` (each
  token's character offset in the choice's text). With `echo` the prompt's tokens come first, the first
  with null logprob and null top.

A token's text is its own decoding, special tokens included; `bytes` are that text's UTF-8 bytes (a token
holding part of a character decodes to U+FFFD, as in vLLM). A streamed completion's `text_offset`
continues from the choice's previous chunk (`CompletionOffsets`).
"""
from __future__ import annotations

from typing import Any, Callable

from kvstrata.model.logprobs import TokenLogprob

TokenText = Callable[[int], str]
MIN_LOGPROB = -9999.0  # a -inf logprob (a token the model cannot produce) is sent as this: JSON has no -inf


def _finite(x: float) -> float:
    return max(x, MIN_LOGPROB)


def _item(text_of: TokenText, token: int, logprob: float) -> dict[str, Any]:
    text = text_of(token)
    return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob], text_of: TokenText) -> dict[str, Any]:
    """A chat choice's (or a chunk's) `logprobs`."""
    return {"content": [
        {**_item(text_of, e.token, e.logprob), "top_logprobs": [_item(text_of, t, lp) for t, lp in e.top]}
        for e in entries
    ]}


class CompletionOffsets:
    """The running character offset of one completion choice's tokens, across streamed chunks."""

    def __init__(self) -> None:
        self.offset = 0


def completion_logprobs(
    entries: list[TokenLogprob | None], text_of: TokenText, first_tokens: list[int], offsets: CompletionOffsets
) -> dict[str, Any]:
    """A completion choice's (or chunk's) `logprobs`. `first_tokens`: the tokens of the leading None entries
    (echo: the prompt's first token has no logprob)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    lead = iter(first_tokens)
    for e in entries:
        token = next(lead) if e is None else e.token
        text = text_of(token)
        out["tokens"].append(text)
        out["text_offset"].append(offsets.offset)
        offsets.offset += len(text)
        if e is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(_finite(e.logprob))
        top = {text_of(t): _finite(lp) for t, lp in e.top}
        top.setdefault(text, _finite(e.logprob))
        out["top_logprobs"].append(top)
    return out
