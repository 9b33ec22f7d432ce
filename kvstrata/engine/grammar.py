"""Constrained decoding with llguidance: a matcher per constrained request, a token mask per step.

`GrammarBackend` builds llguidance's tokenizer from ours (the `tokenizers` JSON, once: about
0.3-1.5 s for SmolLM2's 49k vocabulary, holding the GIL, so the server does it in its warm-up,
`prepare()`) and a matcher per grammar string (`SamplingParams.grammar`); grammar_cache.py keeps
compiled ones and hands out copies, off the engine thread. Each step, `mask_logits` sets every token
the grammar forbids to -inf on the rows that sample, before the sampler sees them (greedy and
sampled alike); `advance` feeds the chosen token to the matcher and says whether the grammar has
finished (the request then stops with "stop").
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvstrata.engine.sampling_params import InvalidRequestError

if TYPE_CHECKING:
    from kvstrata.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class GrammarBackend:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the logits' width (the model's vocabulary)
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()
        self.mask_words = (vocab_size + 31) // 32  # int32 words of one token mask

    def prepare(self) -> None:
        """Build llguidance's tokenizer now (the server's warm-up), not at the first constrained request."""
        self._ll_tokenizer_once()

    def _ll_tokenizer_once(self) -> Any:
        with self._lock:  # the compile thread and the engine thread may both ask first
            if self._ll_tokenizer is None:
                import llguidance

                self._ll_tokenizer = llguidance.LLTokenizer(
                    self.tokenizer.backend.to_str(), n_vocab=self.vocab_size,
                    eos_token=list(self.tokenizer.eos_token_ids),
                )
            return self._ll_tokenizer

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for `grammar`; a grammar llguidance refuses is the client's error."""
        import llguidance

        m = llguidance.LLMatcher(self._ll_tokenizer_once(), grammar, log_level=0)
        if m.is_error():
            raise InvalidRequestError(f"the output constraint cannot be compiled: {m.get_error()}", "response_format")
        return m

    def mask_logits(self, logits: torch.Tensor, matchers: list[Any], drafts: list[list[int]] | None = None) -> torch.Tensor:
        """logits: [S, V], one row per sampling request (len(drafts[i]) + 1 rows for a request verifying a
        draft) -> the same with each constrained row's forbidden tokens at -inf; rows whose matcher is
        None are left as they are. A draft's row j is masked in the grammar's state after draft[:j], walked
        on a copy of the request's matcher (~16 us at 1,200 tokens): the engine feeds the matcher itself
        only what is emitted. Not a walk then `rollback` on the matcher: a stopped matcher takes EOS
        without recording it, so a draft that completes the grammar then drafts EOS would roll back one
        token too many (a forced call then read `{"city":Rome`, its opening quote lost)."""
        if all(m is None for m in matchers):
            return logits
        bits = np.full((logits.shape[0], self.mask_words), -1, dtype=np.int32)  # all allowed
        row = 0
        for i, m in enumerate(matchers):
            draft = drafts[i] if drafts is not None else []
            if m is not None:
                walk = m.deep_copy() if draft else m
                for j in range(len(draft) + 1):
                    v = bits[row + j]
                    walk.unsafe_compute_mask_ptr(v.ctypes.data, v.nbytes)
                    if j < len(draft) and not walk.consume_token(draft[j]):  # drafts were cut to what it accepts
                        raise RuntimeError(f"grammar refused draft token {draft[j]}: {walk.get_error()}")
            row += len(draft) + 1
        forbid = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : logits.shape[-1]] == 0
        if logits.device.type != "cpu":
            return logits.masked_fill(torch.from_numpy(forbid).to(logits.device), float("-inf"))
        # on CPU numpy's putmask over the vocabulary is far cheaper than torch's masked_fill (docs/agents.md)
        out = logits.detach().numpy().copy()
        np.putmask(out, forbid, -np.inf)
        return torch.from_numpy(out)

def advance(matcher: Any, token: int) -> bool:
    """Feed the sampled token; True when the grammar is done (or broken) and the request must stop."""
    if not matcher.consume_token(token):
        log.warning("grammar rejected token %d: %s", token, matcher.get_error())
        return True
    return bool(matcher.is_stopped())
