"""The multi-round QA workload: seeded, LMCache's shape, histories that grow by the real answers."""
from __future__ import annotations

from typing import Any

import pytest

from kvstrata.bench.achievable import SentSequence, achievable_tokens, prompt_token_ids
from kvstrata.bench.multiround.workload import MAX_CONTEXT_TOKENS, MultiRoundConfig, generate_multiround

SMALL = MultiRoundConfig(num_users=3, num_rounds=3, system_tokens=300, history_tokens=400, question_tokens=20,
                         answer_tokens=16)


def n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_seeded_and_users_independent_of_their_number() -> None:
    assert generate_multiround(SMALL) == generate_multiround(SMALL)
    other = generate_multiround(MultiRoundConfig(num_users=3, num_rounds=3, system_tokens=300, history_tokens=400,
                                                 seed=1))
    assert other.system_prompt != generate_multiround(SMALL).system_prompt
    more = generate_multiround(MultiRoundConfig(num_users=5, num_rounds=3, system_tokens=300, history_tokens=400,
                                                question_tokens=20, answer_tokens=16))
    assert more.sessions[:3] == generate_multiround(SMALL).sessions


def test_shape_users_rounds_shared_system_own_history() -> None:
    w = generate_multiround(SMALL)
    assert len(w.sessions) == 3 and w.num_requests == 9
    assert [s.session_id for s in w.sessions] == [0, 1, 2]
    assert len(set(w.histories)) == 3
    for user, session in enumerate(w.sessions):
        assert len(session.turns) == 3
        assert session.turns[0].content.startswith(w.histories[user] + "\n\n")
        assert all(w.histories[user] not in t.content for t in session.turns[1:])  # the history is sent once
        assert all(t.content.endswith("?") for t in session.turns)
        first = w.messages(user, [])
        assert first == [{"role": "system", "content": w.system_prompt},
                         {"role": "user", "content": session.turns[0].content}]


def test_history_grows_by_each_answer_and_question() -> None:
    w = generate_multiround(SMALL)
    third = w.messages(1, ["answer one", "answer two"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[:3] == [*w.messages(1, []), {"role": "assistant", "content": "answer one"}]
    assert [third[4]["content"], third[5]["content"]] == ["answer two", w.sessions[1].turns[2].content]
    with pytest.raises(ValueError, match="only 3 rounds"):
        w.messages(1, ["a", "b", "c"])


def test_token_counts_match_lmcache_shape(tokenizer: Any) -> None:
    config = MultiRoundConfig(num_users=4, num_rounds=5, system_tokens=1000, history_tokens=2000, question_tokens=20)
    w = generate_multiround(config)
    assert abs(n_tokens(tokenizer, w.system_prompt) / 1000 - 1) <= 0.15
    for user, session in enumerate(w.sessions):
        assert abs(n_tokens(tokenizer, w.histories[user]) / 2000 - 1) <= 0.15
        for turn in session.turns[1:]:
            assert abs(n_tokens(tokenizer, turn.content) / 20 - 1) <= 0.3, turn
    last = prompt_token_ids(tokenizer, w.messages(0, ["word " * 99] * 4))  # 4 answers of ~100 tokens
    assert abs(len(last) / (config.last_round_tokens() - 100) - 1) <= 0.15
    assert config.last_round_tokens() <= MAX_CONTEXT_TOKENS


def test_achievable_hits_are_the_shared_system_prompt_then_the_whole_previous_round(tokenizer: Any) -> None:
    """Users one after another, rounds one after another: what each request could have reused."""
    w = generate_multiround(SMALL)
    replies = [[f"Answer {u}.{r} about the notes." for r in range(3)] for u in range(3)]
    seqs, prompts, t = [], {}, 0.0
    for user in range(3):
        for round_ in range(3):
            ids = prompt_token_ids(tokenizer, w.messages(user, replies[user][:round_]))
            reply = tokenizer.encode(replies[user][round_], add_special_tokens=False)
            prompts[user, round_] = (ids, reply)
            seqs.append(SentSequence(ids, reply, t, t + 0.1, t + 0.5))
            t += 1.0
    achievable = dict(zip(prompts, achievable_tokens(seqs, page_size=16)))
    assert achievable[0, 0] == 0
    shared = common_prefix(prompts[0, 0][0], prompts[1, 0][0])
    assert shared >= n_tokens(tokenizer, w.system_prompt)  # the whole system prompt is shared ...
    assert achievable[1, 0] == achievable[2, 0] == shared // 16 * 16  # ... and not one user's history
    for user in range(3):
        for round_ in (1, 2):
            ids, reply = prompts[user, round_ - 1]
            assert prompts[user, round_][0][: len(ids) + len(reply)] == ids + reply  # history grows by the answer
            assert achievable[user, round_] == (len(ids) + len(reply)) // 16 * 16


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"num_users": 0}, "--num-users"),
        ({"num_rounds": 0}, "--num-rounds"),
        ({"system_tokens": 5}, "--system-tokens"),
        ({"history_tokens": -1}, "--history-tokens"),
        ({"question_tokens": 1}, "--question-tokens"),
        ({"answer_tokens": 0}, "--answer-tokens"),
        ({"num_rounds": 10}, "--num-rounds"),  # 1000 + 2000 + 10 x 120 tokens: past a 4096-token context
    ],
)
def test_out_of_shape_parameters_name_the_flag(kwargs: dict[str, int], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        generate_multiround(MultiRoundConfig(**kwargs))


def test_no_history_sends_only_the_question() -> None:
    w = generate_multiround(MultiRoundConfig(num_users=1, num_rounds=1, history_tokens=0))
    assert w.histories == ("",) and w.sessions[0].turns[0].content.startswith("Question 1: ")
