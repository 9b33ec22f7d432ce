"""`synth-model --ends-replies`: random weights whose replies end by themselves, for agent benchmarks.

An agent CLI sends up to 32k max_tokens and treats a reply cut by max_tokens as an error; a random-weight
model says its end-of-turn token about once in its vocabulary's size, so without this every reply runs
to the limit. The rig, on the Q8_0 blocks before any requantizing:

- every token's embedding holds `LEAD` in dimension 0 (the rest of its first block kept small), and the
  end-of-turn token's holds `LEAD + margin`;
- no attention output nor MLP down projection writes dimension 0 (their row 0 is zero), so the residual
  stream keeps it, and the final norm (ones) leaves it the largest entry, about sqrt(hidden) after it;
- the LM head is a tensor of its own (written even where the shape ties it: a tied head would add
  `LEAD` x sqrt(hidden) to every logit, which bf16 logits cannot resolve a margin of 10 on) and holds a
  `margin`-sized weight in dimension 0 for the end-of-turn token only, so that token's logit leads the
  rest by about `EOS_LOGIT`.

Sampled at temperature 1, a reply then ends after a few tokens to a few tens. Every tensor keeps its
shape and block type (a tied shape gains the head's vocab x hidden weights), so each engine does the same
work per token as on a trained model of the shape.
"""
from __future__ import annotations

import math

import numpy as np

LEAD = 64.0  # dimension 0 of every embedding: it dominates the residual stream's RMS
EOS_LOGIT = 10.0  # how far the end-of-turn token's logit leads (e^10 / vocab: a reply of a few tokens)
_Q8_BYTES = 34  # a Q8_0 block: float16 scale, then 32 int8 values


def _set_first(raw: np.ndarray, rows: np.ndarray | slice, value: float) -> None:
    """Block 0 of each row of Q8_0 `raw` [n, bytes] becomes (value, 0 x 31)."""
    block = raw[rows, :_Q8_BYTES]  # [r, 34]
    block[:, 2:] = 0
    block[:, 2] = 127
    scale = np.full(block.shape[0], value / 127, np.float16)
    block[:, 0:2] = scale.view(np.uint8).reshape(-1, 2)
    raw[rows, :_Q8_BYTES] = block


def rig(name: str, raw: np.ndarray, hidden: int, eos_id: int) -> np.ndarray:
    """The Q8_0 rows [n, bytes] of tensor `name`, rigged as the module docstring says (others unchanged)."""
    margin = EOS_LOGIT / math.sqrt(hidden)  # the norm scales dimension 0 to about sqrt(hidden)
    if name == "token_embd.weight":
        _set_first(raw, slice(None), LEAD)
    elif name == "output.weight":
        _set_first(raw, slice(None), 0.0)
        _set_first(raw, np.array([eos_id]), margin)
    elif name.endswith(("attn_output.weight", "ffn_down.weight")):
        raw[0, :] = 0  # row 0 writes dimension 0: every block's scale and values zero
    return raw
