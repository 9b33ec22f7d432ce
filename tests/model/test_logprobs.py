"""token_logprobs: log-softmax values at the chosen tokens and the top k, in slices of rows."""
from __future__ import annotations

import torch

from kvstrata.model import logprobs
from kvstrata.model.logprobs import token_logprobs


def test_values_and_top_match_log_softmax_across_slices(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(logprobs, "SLICE_ROWS", 3)  # 8 rows: slices of 3, 3 and 2
    logits = torch.randn(8, 50, dtype=torch.bfloat16)
    tokens = torch.randint(0, 50, (8,))
    top = [0, 1, 5, 0, 2, 20, 3, 4]
    got = token_logprobs(logits, tokens, top)
    want = torch.log_softmax(logits.float(), -1)
    assert [e.token for e in got] == tokens.tolist()
    for r, e in enumerate(got):
        assert abs(e.logprob - float(want[r, tokens[r]])) < 1e-6
        vals, ids = want[r].topk(top[r]) if top[r] else (torch.empty(0), torch.empty(0, dtype=torch.long))
        assert [t for t, _ in e.top] == ids.tolist() and torch.allclose(torch.tensor([v for _, v in e.top]), vals)


def test_no_rows_no_entries() -> None:
    assert token_logprobs(torch.empty(0, 10), [], []) == []
