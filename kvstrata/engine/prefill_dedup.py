"""Compute a shared prefix once when several requests bring it at the same time.

The prefix cache serves a prefix only after some request has computed it. When sessions of one
agent start together (the same system prompt and tools, nothing cached yet), every one of them
would prefill the shared pages side by side, each paying the whole cost on a CPU where compute is
the bottleneck. Instead a waiting request that shares full pages with a request still prefilling
them waits (keeping its place in the queue) until those pages are computed and inserted by the
chunked prefill, then is admitted and hits them. The wait is bounded: the request it follows
advances every step, and stops counting once preempted or past the shared part.
"""
from __future__ import annotations

from collections.abc import Iterable

from kvstrata.engine.request import Request


def shared_full_pages(a: list[int], b: list[int], page_size: int, limit: int | None = None) -> int:
    """Number of leading full pages whose tokens `a` and `b` have in common, among their first
    `limit` tokens (default: all)."""
    n = min(len(a), len(b), len(a) if limit is None else limit) // page_size
    for p in range(n):
        lo = p * page_size
        if a[lo : lo + page_size] != b[lo : lo + page_size]:
            return p
    return n


def follows_inflight_prefill(req: Request, running: Iterable[Request], page_size: int) -> bool:
    """Whether `req` shares a full page that a running request has yet to compute in its prompt (never for a
    request that computes its whole prompt: prompt logprobs)."""
    if req.params.prompt_logprobs is not None:
        return False
    for other in running:
        computed = other.num_computed_tokens
        if computed >= other.num_prompt_tokens or other.params.extra_key != req.params.extra_key:
            continue  # decoding already, or a cache namespace req could never hit
        # it follows iff the page holding `other`'s next token is shared: compare up to that page only,
        # without copying either prompt (this runs for each waiting request every step)
        needed = (computed // page_size + 1) * page_size
        limit = min(needed, req.num_prompt_tokens, other.num_prompt_tokens)
        if shared_full_pages(req.token_ids, other.token_ids, page_size, limit) * page_size > computed:
            return True
    return False
