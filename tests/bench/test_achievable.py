"""Achievable cached tokens: whole pages of what the server already held, never the last token."""
from __future__ import annotations

from typing import Any

import pytest

from kvstrata.bench.achievable import (
    PrefixLedger,
    SentSequence,
    achievable_tokens,
    prompt_token_ids,
    sent_sequence,
)
from kvstrata.bench.agentic.driver import RequestRecord
from kvstrata.bench.agentic.workload import AgenticConfig, generate_agentic
from kvstrata.bench.client import ChatResult


def test_ledger_matches_whole_pages_and_never_the_last_token() -> None:
    ledger = PrefixLedger(page_size=4)
    ledger.add(list(range(10)))  # pages [0..3] [4..7]; 8, 9 are a partial page: not held
    assert ledger.match(list(range(10))) == 8
    assert ledger.match(list(range(9))) == 8
    assert ledger.match(list(range(8))) == 4  # 8 tokens = 2 pages, but the last token is recomputed
    assert ledger.match([0, 1, 2, 3, 4, 5, 6, 99, 8]) == 4
    assert ledger.match([9, 1, 2, 3, 4, 5, 6, 7, 8]) == 0
    assert ledger.match([0, 1, 2]) == 0
    assert ledger.match([]) == 0


def test_ledger_pages_chain_on_their_prefix() -> None:
    ledger = PrefixLedger(page_size=2)
    ledger.add([1, 2, 3, 4])
    ledger.add([5, 6, 7, 8])
    assert ledger.match([5, 6, 3, 4, 0]) == 2  # page [3, 4] is held only after [1, 2]
    assert ledger.match([1, 2, 3, 4, 0]) == 4


def seq(prompt: list[int], t_sent: float, held: float | None, done: float | None, completion: list[int] | None = None) -> SentSequence:
    return SentSequence(prompt, completion or [], t_sent, held, done)


def test_achievable_follows_what_was_held_when_each_request_was_sent() -> None:
    system = list(range(8))
    a_prompt = system + [10, 11]  # 10 tokens
    a_reply = [100, 101, 102, 103, 104, 105]
    seqs = [
        seq(a_prompt, t_sent=0.0, held=1.0, done=2.0, completion=a_reply),  # A
        seq(system + [50, 51, 52, 53, 54], t_sent=0.5, held=3.0, done=3.5),  # B: A's prefill unfinished
        seq(system + [50, 51, 52, 53, 54, 60], t_sent=1.5, held=4.0, done=4.5),  # C: A's prompt held, B's not
        seq(a_prompt + a_reply + [7, 7, 7, 7, 7], t_sent=2.5, held=5.0, done=6.0),  # D: A's next turn
        seq(system, t_sent=2.6, held=6.0, done=6.5),  # E: 8 tokens, the 8th is recomputed
        seq(system + [50, 51, 52, 53, 54, 60], t_sent=4.6, held=7.0, done=8.0),  # F: repeats C
    ]
    # D: A held prompt + reply = 16 tokens = 4 pages; D has 21 tokens, so up to 5 pages could match.
    assert achievable_tokens(seqs, page_size=4) == [0, 0, 8, 16, 4, 12]
    assert achievable_tokens(seqs, page_size=8) == [0, 0, 8, 16, 0, 8]


def test_failed_requests_hold_nothing_and_no_request_matches_itself() -> None:
    prompt = list(range(40))
    seqs = [
        seq(prompt, t_sent=0.0, held=None, done=None),  # failed before its first token
        seq(prompt, t_sent=1.0, held=1.0, done=1.0),  # held "at once": still not before its own send
        seq(prompt, t_sent=2.0, held=3.0, done=4.0),
    ]
    assert achievable_tokens(seqs, page_size=16) == [0, 0, 32]


def result(text: str, finish_reason: str | None = "length", error: str | None = None) -> ChatResult:
    return ChatResult(text, 0.0, 1.0, 0.1, finish_reason, None, None, None, 1, error)


def test_reply_tokens_are_what_the_next_turn_resends(tokenizer: Any) -> None:
    """prompt(turn 1) starts with prompt(turn 0) + tokenize(reply): the premise of the ledger."""
    w = generate_agentic(AgenticConfig(sessions=1, turns=2, system_tokens=800, turn_tokens=40))
    reply = " Sure, I will call search_orders(order_id=42) now.\n\nDone"
    first = prompt_token_ids(tokenizer, w.messages(0, []))
    second = prompt_token_ids(tokenizer, w.messages(0, [reply]))
    reply_ids = tokenizer.encode(reply, add_special_tokens=False)
    assert second[: len(first) + len(reply_ids)] == first + reply_ids


def test_sent_sequence_drops_the_last_token_of_a_cut_reply(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    ids = tokenizer.encode("one two three", add_special_tokens=False)
    cut = sent_sequence(RequestRecord(0, 0, 0, "user", messages, result("one two three", "length")), tokenizer)
    stopped = sent_sequence(RequestRecord(0, 0, 0, "user", messages, result("one two three", "stop")), tokenizer)
    failed = sent_sequence(RequestRecord(0, 0, 0, "user", messages, result("", None, "HTTP 500")), tokenizer)
    assert cut.completion_ids == ids[:-1] and stopped.completion_ids == ids
    assert cut.prompt_ids == prompt_token_ids(tokenizer, messages)
    assert (cut.t_prompt_held, cut.t_done) == (pytest.approx(0.1), 1.0)
    assert (failed.completion_ids, failed.t_done) == ([], None)

