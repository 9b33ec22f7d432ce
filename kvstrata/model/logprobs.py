"""Token logprobs: the model's log-softmax at a token, and the top alternatives, for many rows at once.

The values are the model's own distribution (its logits' log-softmax, float32), taken before the
grammar mask, logit bias, penalties and temperature change the logits (vLLM's default `raw_logprobs`);
so a logprob does not depend on how the token was chosen, and a verify step's row gives what plain
decoding's row gives. Rows are done in slices (`SLICE_ROWS`): a prompt's rows (completions' `echo`)
can be thousands, and a log-softmax of all of them at once would double the logits' memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TokenLogprob travels to the gateway, which never loads torch (tests/test_gateway_imports.py)
    import torch

SLICE_ROWS = 256


@dataclass(frozen=True)
class TokenLogprob:
    """A token's logprob and the `k` most likely tokens at its position (ids and logprobs, best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor | list[int], top: list[int]) -> list[TokenLogprob]:
    """logits [R, V] (any float dtype), tokens [R]: row r's logprob of tokens[r] and its top[r] best. One
    host read per slice of rows."""
    import torch

    if logits.shape[0] == 0:
        return []
    tok = torch.as_tensor(tokens, dtype=torch.long, device=logits.device).view(-1, 1)
    tok_l = tok.view(-1).tolist()
    kmax = max(top)
    out: list[TokenLogprob] = []
    for lo in range(0, logits.shape[0], SLICE_ROWS):
        hi = min(lo + SLICE_ROWS, logits.shape[0])
        lp = torch.log_softmax(logits[lo:hi].float(), dim=-1)
        chosen = lp.gather(1, tok[lo:hi]).view(-1).tolist()
        if kmax:
            vals, ids = lp.topk(kmax, dim=-1)
            vals_l, ids_l = vals.tolist(), ids.tolist()
        for r in range(hi - lo):
            k = top[lo + r]
            best = tuple(zip(ids_l[r][:k], vals_l[r][:k])) if k else ()
            out.append(TokenLogprob(tok_l[lo + r], chosen[r], best))
    return out
