"""Draft sources replayed over recorded replies (kvstrata/bench/spec/replay.py): the step accounting of a
greedy verify step, and the engine's drafter's two modes on replies that copy the prompt or an earlier reply."""
from __future__ import annotations

import random

import pytest

from kvstrata.bench.spec.replay import KvstrataSource, Recorded, Replayed, replay, replay_request, summary


class Oracle:
    """Proposes the recorded reply's next tokens: every draft is kept whole."""

    name = "oracle"

    def __init__(self, output: list[int]) -> None:
        self.output = output
        self.calls: list[str] = []

    def start(self, rid: int, tenant: str, prompt: list[int]) -> None:
        self.prompt_len = len(prompt)
        self.calls.append("start")

    def propose(self, rid: int, context: list[int], k: int) -> list[int]:
        t = len(context) - self.prompt_len
        return self.output[t:t + k]

    def emitted(self, rid: int, tokens: list[int]) -> None:
        self.calls.append(f"emitted {len(tokens)}")

    def finish(self, rid: int) -> None:
        self.calls.append("finish")


def fresh(rng: random.Random, n: int, lo: int = 1000) -> list[int]:
    return [rng.randrange(lo, lo + 100_000) for _ in range(n)]


@pytest.mark.parametrize("n, k", [(1, 4), (2, 4), (41, 4), (40, 16), (100, 1)])
def test_a_kept_draft_emits_k_plus_one_tokens_a_step_after_the_prompts_token(n: int, k: int) -> None:
    output = list(range(500, 500 + n))
    source = Oracle(output)
    r = replay_request(source, 0, Recorded("code", "", [1, 2, 3], output), k)
    assert r.steps == -(-(n - 1) // (k + 1))  # the first token is the prompt step's
    assert r.accepted == n - 1 - r.steps and r.drafted == r.accepted  # every draft kept whole
    assert source.calls[0] == "start" and source.calls[-1] == "finish"
    assert sum(int(c.split()[1]) for c in source.calls if c.startswith("emitted")) == n
    assert summary([r])["tokens_per_step"] == pytest.approx((n - 1) / r.steps if r.steps else 0.0)


def test_a_reply_that_copies_its_prompt_comes_many_tokens_a_step() -> None:
    rng = random.Random(0)
    doc = fresh(rng, 300)
    rows = replay(KvstrataSource("ngram"), [Recorded("code", "", [7, 8] + doc + [9], doc)], k=16)
    s = summary(rows)
    assert s["tokens_per_step"] > 8 and s["accepted"] <= s["drafted"]
    assert s["steps"] + s["accepted"] == len(doc) - 1


def test_new_text_gets_no_accepted_drafts() -> None:
    rng = random.Random(1)
    rows = replay(KvstrataSource("suffix"), [Recorded("json", "", fresh(rng, 50), fresh(rng, 80, lo=200_000))], k=8)
    assert rows[0].accepted == 0 and rows[0].steps == 79 and summary(rows)["tokens_per_step"] == 1.0


def test_only_suffix_drafts_from_the_tenants_earlier_reply() -> None:
    rng = random.Random(2)
    reply = fresh(rng, 200, lo=300_000)
    requests = [Recorded("tool", "t", fresh(rng, 40), reply), Recorded("tool", "t", fresh(rng, 40), reply)]
    suffix, ngram = (replay(KvstrataSource(m), requests, k=16) for m in ("suffix", "ngram"))
    assert suffix[1].accepted > 150 and ngram[1].accepted == 0
    assert [r.accepted for r in suffix[:1]] == [r.accepted for r in ngram[:1]]  # the first sees no earlier reply
    other = replay(KvstrataSource("suffix"), [requests[0], Recorded("tool", "u", requests[1].prompt, reply)], k=16)
    assert other[1].accepted == 0  # another tenant's reply never drafts


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="k must be"):
        replay_request(KvstrataSource(), 0, Recorded("code", "", [1], [2, 3]), 0)
    with pytest.raises(ValueError, match="mode"):
        KvstrataSource("auto")
    assert summary([Replayed("code")])["tokens_per_step"] == 0.0
