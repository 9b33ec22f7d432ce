"""OutputProcessor: detokenize, apply stop conditions, and cut RequestOutput deltas.

Stop strings are searched in the detokenized text; while a request runs, the last
(longest stop string - 1) characters are held back so a stop string split across tokens is
never streamed before it is recognised. Only the text not yet sent is kept, and each output
carries the new tokens only: a step's work does not grow with the length of the output.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvstrata.engine.outputs import RequestOutput
from kvstrata.engine.request import Request
from kvstrata.model.detokenizer import IncrementalDetokenizer
from kvstrata.model.tokenizer import Tokenizer


@dataclass
class _State:
    detok: IncrementalDetokenizer
    pending: str = ""  # text not sent yet (at least the held-back tail), cut at a stop string
    sent_tokens: int = 0
    sent_prompt_logprobs: bool = False
    holdback: int = 0
    stop_string: str | None = None  # the stop string that ended the request, if one did


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...], max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self._states: dict[str, _State] = {}

    def add(self, req: Request) -> None:
        holdback = max((len(s) for s in req.params.stop), default=1) - 1
        self._states[req.request_id] = _State(IncrementalDetokenizer(self.tokenizer), holdback=holdback)

    def append_token(self, req: Request, token: int) -> str | None:
        """Record a sampled token; return a finish reason if the request must stop now."""
        st = self._states[req.request_id]
        p = req.params
        is_eos = token in self.eos_token_ids and not p.ignore_eos
        if is_eos or token in p.stop_token_ids:
            return "stop"
        before = len(st.pending)
        st.pending += st.detok.feed(token)
        if p.stop:  # a stop string can only start in the held-back tail or the new text
            start = max(0, before - st.holdback)
            hits = [(i, s) for i, s in ((st.pending.find(s, start), s) for s in p.stop) if i >= 0]
            if hits:
                at, st.stop_string = min(hits, key=lambda hit: hit[0])
                st.pending = st.pending[:at]
                return "stop"
        if req.num_output_tokens >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    def output(self, req: Request) -> RequestOutput:
        """The delta since the previous output of this request."""
        st = self._states[req.request_id]
        if req.finished and req.finish_reason == "length":
            st.pending += st.detok.flush()  # an incomplete character held back at the very end
        end = len(st.pending) if req.finished else max(0, len(st.pending) - st.holdback)
        new_text, st.pending = st.pending[:end], st.pending[end:]
        sent = st.sent_tokens
        new_tokens = req.token_ids[req.num_prompt_tokens + sent :]  # no copy of the whole output
        st.sent_tokens = req.num_output_tokens
        out = RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_tokens,
            new_text=new_text,
            finished=req.finished,
            finish_reason=req.finish_reason,
            prompt_tokens=req.num_prompt_tokens,
            cached_tokens=req.stats.cached_tokens,
            output_tokens=req.num_output_tokens,
            error=req.error,
            stats=req.stats,
            stop_string=st.stop_string if req.finished else None,
        )
        if req.params.logprobs is not None:  # one per new token
            out.new_logprobs = req.logprobs[sent:]
        if req.params.prompt_logprobs is not None and not st.sent_prompt_logprobs and req.prompt_logprobs:
            out.prompt_logprobs, st.sent_prompt_logprobs = req.prompt_logprobs, True
        if req.finished:
            del self._states[req.request_id]
        return out
