"""Speculative decoding from the agent's own context (docs/speculative.md).

`context_match.py` finds where the request's own context ended the same way before, `token_index.py` the
same in its tenant's recent outputs; `drafter.py` drafts from both and learns the request's acceptance;
`speculator.py` gives a step's decode rows their drafts while they pay (`cost.py` times what a row
costs on the host); `verify.py` keeps what the model agrees with (the runner scores the drafts as
decode rows, the engine marks only accepted tokens computed).
"""
