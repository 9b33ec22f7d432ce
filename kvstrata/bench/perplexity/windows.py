"""Which tokens a perplexity run scores, the same rule as llama.cpp's `llama-perplexity`, so the two agree.

The text is tokenized once, whole, the way the server tokenizes a prompt by default: a vocab that adds a
BOS puts one before the first text token. The ids are then cut into back-to-back windows of `ctx` tokens,
with no overlap; the tail shorter than a window is dropped, and `--max-windows` keeps only the first ones
(llama.cpp's `--chunks`). Each window is sent alone, as a fresh sequence, after its leading special
tokens (the BOS) are written over its first tokens: the window keeps its length, so window k > 0 loses
its first text token to the BOS rather than growing by one (llama.cpp overwrites in the same way).

Only the second half of a window is scored, so that every scored token is predicted with at least
`ctx / 2` tokens of context: with `first = ctx // 2`, the tokens at positions `first + 1 .. ctx - 1`,
`ctx - first - 1` of them per window (position `first` itself is not scored: llama.cpp reads the logits
at `first .. ctx - 2`, each predicting the next token). A token's negative log-likelihood is minus the
log-probability the model gave it after the window's earlier tokens; perplexity is exp of the mean over
every scored token of every window. The error bar is llama.cpp's too: the standard error of that mean,
times the perplexity.

llama.cpp refuses a text of fewer than `2 * ctx` tokens; this side needs only one whole window.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

MIN_CTX = 16  # below this a window's scored half is a handful of tokens


def scored_positions(ctx: int) -> range:
    """Positions in a window of `ctx` tokens whose token is scored (the second half, see above)."""
    return range(ctx // 2 + 1, ctx)


def cut_windows(ids: Sequence[int], ctx: int, special_prefix: Sequence[int] = (),
                max_windows: int | None = None) -> list[list[int]]:
    """The whole windows of `ids`, each with `special_prefix` written over its first tokens."""
    if ctx < 2 or len(special_prefix) >= ctx // 2 + 1:
        raise ValueError(f"a window of {ctx} tokens cannot hold its special tokens and a scored half")
    count = len(ids) // ctx if max_windows is None else min(len(ids) // ctx, max_windows)
    out = []
    for k in range(count):
        window = list(ids[k * ctx:(k + 1) * ctx])
        window[:len(special_prefix)] = special_prefix
        out.append(window)
    return out


def window_nlls(token_logprobs: Sequence[float | None], ctx: int) -> list[float]:
    """The negative log-likelihood of each scored token of one window, from its echoed per-token
    log-probabilities (one per prompt token, the first None; anything after the prompt is ignored)."""
    if len(token_logprobs) < ctx:
        raise ValueError(f"the server echoed {len(token_logprobs)} log-probabilities for a {ctx}-token prompt")
    out = []
    for j in scored_positions(ctx):
        lp = token_logprobs[j]
        if lp is None or not math.isfinite(lp) or lp > 1e-6:  # a log-probability is <= 0
            raise ValueError(f"the server's log-probability of prompt token {j} is {lp!r}")
        out.append(-float(lp))
    return out


@dataclass
class Perplexity:
    """Running totals over scored tokens; `add` one window's NLLs at a time."""

    nll: float = 0.0
    nll_sq: float = 0.0
    tokens: int = 0
    windows: int = 0
    per_window: list[float] = field(default_factory=list)  # each window's own perplexity

    def add(self, nlls: Sequence[float]) -> None:
        self.nll += sum(nlls)
        self.nll_sq += sum(x * x for x in nlls)
        self.tokens += len(nlls)
        self.windows += 1
        self.per_window.append(math.exp(sum(nlls) / len(nlls)) if nlls else math.nan)

    def value(self) -> float:
        """exp(mean NLL over every scored token)."""
        return math.exp(self.nll / self.tokens) if self.tokens else math.nan

    def error(self) -> float | None:
        """The standard error of the mean NLL times the perplexity (None under two tokens)."""
        if self.tokens < 2:
            return None
        mean = self.nll / self.tokens
        var = self.nll_sq / self.tokens - mean * mean
        return math.sqrt(max(var, 0.0) / (self.tokens - 1)) * self.value()
