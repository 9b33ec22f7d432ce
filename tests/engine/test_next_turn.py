"""The next turn's opener prefilled after a reply (kvstrata/engine/next_turn.py), on the tiny random-weight
model in float32: the next turn reads it from the cache, its greedy output is the same as without caching,
and no follow-up runs where it should not."""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvstrata.engine.llm import LLM
from kvstrata.engine.next_turn import FOLLOW_UP_PREFIX, follow_up, is_follow_up
from kvstrata.engine.request import Request
from kvstrata.engine.sampling_params import MAX_PRIORITY, SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def make(tiny_model_dir: Path, **kw: Any) -> LLM:
    return LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=4096, **kw)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def reply_ending(llm: LLM, n: int) -> tuple[list[int], list[int], int]:
    """A prompt of n tokens, its greedy reply's first tokens and a token to stop it on: the first token not
    among those before it (the tiny model repeats its first token after most prompts: then a reply of none)."""
    prompt = tokens(n, seed=n)
    out = llm.generate([prompt], GREEDY)[0].token_ids
    k = next((i for i in range(1, len(out)) if out[i] not in out[:i]), 0)
    return prompt, out[:k], out[k]


def test_next_turn_reads_the_opener_from_the_cache(tiny_model_dir: Path) -> None:
    opener_rest = [7, 11, 13]
    user = tokens(9, seed=2)
    results = {}
    for on in (True, False):
        llm = make(tiny_model_dir)
        prompt, reply, end = reply_ending(make(tiny_model_dir), 70)
        params = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(end,),
                                next_turn=(end, *opener_rest) if on else ())
        first = llm.generate([prompt], params)[0]
        assert first.finish_reason == "stop" and first.token_ids == [*reply, end]
        assert not llm.engine.has_unfinished()  # the follow-up ran inside generate, and reported nothing
        nxt = [*prompt, *reply, end, *opener_rest, *user]
        results[on] = llm.generate([nxt], GREEDY)[0]
    fresh = make(tiny_model_dir, enable_prefix_caching=False).generate([nxt], GREEDY)[0]
    # with the follow-up every token before the user's text is cached (the part page a tail); without it the
    # sampled end token was never run, so the match stops at the reply's last token
    assert results[True].cached_tokens == len(prompt) + len(reply) + 1 + len(opener_rest)
    assert results[False].cached_tokens == len(prompt) + len(reply)
    assert results[True].token_ids == results[False].token_ids == fresh.token_ids


def test_no_follow_up_without_its_end_token_or_with_other_work(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    prompt, reply, end = reply_ending(llm, 40)
    # stopped by length: the reply's end is not the opener's first token, so nothing follows
    out = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0, next_turn=(end, 5)))[0]
    assert out.finish_reason == "length"
    # two requests in one batch: when the first ends the second still runs, so the first gets no follow-up
    # (the engine would have to add its step to the running one's)
    engine = llm.engine
    added: list[str] = []
    original = engine.add_request
    engine.add_request = lambda rid, *a, **k: (added.append(rid), original(rid, *a, **k))[1]  # type: ignore[method-assign]
    engine.add_request("a", prompt, SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(end,),
                                                   next_turn=(end, 5)))
    engine.add_request("b", tokens(40, seed=4), replace(GREEDY, max_tokens=16))
    while engine.has_unfinished():
        engine.step()
    assert added == ["a", "b"]
    # alone, the same request is followed up
    engine.add_request("c", prompt, SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(end,),
                                                   next_turn=(end, 5)))
    finished = []
    while engine.has_unfinished():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert added[2:] == ["c", FOLLOW_UP_PREFIX + "c"] and finished == ["c"]


def test_follow_up_carries_the_tenant_and_the_lowest_priority() -> None:
    params = SamplingParams(max_tokens=4, temperature=0.7, stop_token_ids=(9,), next_turn=(9, 1, 2), extra_key="t1",
                            cache_key="s", retention="24h", retain_tokens=32)
    req = Request("chatcmpl-1", [5, 6, 7], params)
    req.token_ids += [8, 9]
    req.finish_reason = "stop"
    rid, prompt, p = follow_up(req, max_model_len=100)  # type: ignore[misc]
    assert rid == FOLLOW_UP_PREFIX + "chatcmpl-1" and prompt == [5, 6, 7, 8, 9, 1, 2]
    assert (p.extra_key, p.cache_key, p.retention, p.retain_tokens) == ("t1", "s", "24h", 32)
    assert p.priority == MAX_PRIORITY and p.max_tokens == 1 and p.greedy and not p.next_turn
    assert follow_up(req, max_model_len=7) is None  # no room for its one token
    for reason, last in (("length", 9), ("stop", 8)):
        other = replace(req, token_ids=[5, 6, 7, 8, last], finish_reason=reason)
        other.num_prompt_tokens = 3
        assert follow_up(other, 100) is None
    req.request_id = FOLLOW_UP_PREFIX + "x"  # a follow-up's own end never queues another
    assert follow_up(req, 100) is None
