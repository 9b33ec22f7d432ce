"""Speculative decoding from the agent's own context (issue 27): the draft source.

`token_index.py` finds where a context's end occurred before and drafts what followed; `drafter.py`
keeps one index per request (its prompt and output) and one per tenant (its recent outputs) and adapts
the draft length. Verification in the engine (several rows per request in one step, KV rollback of
rejected tokens) is not built yet: nothing in the engine calls this package so far.
"""
