"""The next turn's opening tokens, computed while the client works on this reply.

A chat reply that ends on its turn-end token (ChatML's `<|im_end|>`, which Qwen and SmolLM2 stop on) is
followed, in the conversation an agent sends next, by that token and the template's opening of the next
message (`\n<|im_start|>user\n`): tokens known before the client's next request arrives. The sampled
turn-end token itself was never run through the model, so without this the next turn computes it and the
opener beside its own new text: 5 of the ~17 new tokens of a Claude Code turn, each a query row over the
whole context.

`SamplingParams.next_turn` carries the opener (the serving layer derives it from the chat template:
serving/next_turn.py). When such a request stops on the opener's first token and the engine has nothing
else to run, the engine queues a follow-up of prompt + reply + the rest of the opener at the lowest
priority, for one discarded output token. Its pages go into the prefix cache and its part page is left as
a tail (kv/tail_pages.py), which the next turn's request takes. The follow-up carries the request's tenant
salt, session key and retention, so only the same tenant's requests can read it; nothing reports it (no
stream, no stats line, no metrics): it is the cache's work, not a request anybody sent.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

from kvstrata.engine.outputs import EngineOverloadedError
from kvstrata.engine.request import Request
from kvstrata.engine.sampling_params import MAX_PRIORITY, InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)

FOLLOW_UP_PREFIX = "next-turn-"  # a follow-up's request id: this, then its request's
_FOLLOW_UP = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, priority=MAX_PRIORITY)


class _Engine(Protocol):
    """What a follow-up needs of the engine (engine.py's Engine; a protocol, so no import circle)."""

    def has_unfinished(self) -> bool: ...

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> object: ...


def is_follow_up(request_id: str) -> bool:
    return request_id.startswith(FOLLOW_UP_PREFIX)


def follow_up(req: Request, max_model_len: int) -> tuple[str, list[int], SamplingParams] | None:
    """The follow-up to queue after `req` finished (id, prompt, params), or None: the request has no opener,
    did not stop on the opener's first token (a stop string, a length or abort, another end token), is a
    follow-up itself, or prompt + reply + opener would not leave room for its one token."""
    opener = req.params.next_turn
    if (not opener or req.finish_reason != "stop" or is_follow_up(req.request_id)
            or req.num_output_tokens < 1 or req.token_ids[-1] != opener[0]):
        return None
    tokens = req.token_ids + list(opener[1:])
    if len(tokens) >= max_model_len:
        return None
    p = req.params
    params = replace(_FOLLOW_UP, extra_key=p.extra_key, cache_key=p.cache_key, retention=p.retention,
                     retain_tokens=p.retain_tokens)
    return FOLLOW_UP_PREFIX + req.request_id, tokens, params


def queue_follow_up(engine: _Engine, req: Request, max_model_len: int) -> None:
    """After `req` finished: its follow-up, where it has one and the engine has nothing else to run (under
    load a follow-up would take a step from requests people wait on). Best effort: where it cannot be
    queued, the next turn computes those tokens itself."""
    if engine.has_unfinished():
        return
    found = follow_up(req, max_model_len)
    if found is None:
        return
    try:
        engine.add_request(*found)
    except (InvalidRequestError, EngineOverloadedError) as exc:
        log.debug("next-turn follow-up of %s not queued: %s", req.request_id, exc)
