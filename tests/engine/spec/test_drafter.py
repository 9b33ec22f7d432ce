"""A request's drafter (kvstrata/engine/spec/drafter.py): drafts from its own context and from its
tenant's recent outputs only, draft length bounded by the match, auto-off on low acceptance."""
from __future__ import annotations

import pytest

from kvstrata.engine.spec.drafter import RequestDrafter, SpecConfig, TenantOutputs

DOC = list(range(200, 260))  # a "file" the agent sends and expects back with a change


def test_a_reply_that_copies_the_prompt_is_drafted_as_it_goes() -> None:
    cfg = SpecConfig(max_tokens=8)
    d = RequestDrafter([1, 2, 3] + DOC + [4, 5], "t", TenantOutputs(cfg), cfg)
    d.append(DOC[:4])
    assert d.propose().tokens == DOC[4:8]  # a 4-token match drafts at most 4 (spec_factor 1)
    d.append(DOC[4:8])
    d.record(4, 4)
    assert d.propose().tokens == DOC[8:16]
    assert d.propose(max_tokens=3).tokens == DOC[8:11]
    assert d.stats.accepted_lengths == {4: 1} and d.stats.acceptance == 1.0


def test_draft_length_is_bounded_by_the_match() -> None:
    cfg = SpecConfig(max_tokens=8, spec_factor=1.0, min_match=1)
    d = RequestDrafter([7] + DOC + [9], "t", TenantOutputs(cfg), cfg)
    d.append(DOC[:2])  # [.., 9, 200, 201]: [200, 201] matches (2 tokens): at most 2 drafted
    assert d.propose().tokens == DOC[2:4]


def test_a_tenants_outputs_draft_for_that_tenant_only() -> None:
    cfg = SpecConfig(max_tokens=6)
    outputs = TenantOutputs(cfg)
    first = RequestDrafter([1, 2], "alice", outputs, cfg)
    first.append([50, 51] + DOC[:20])
    first.finish()
    again = RequestDrafter([3, 4], "alice", outputs, cfg)
    again.append([50, 51])
    assert again.propose().tokens == DOC[:2]  # bounded by its 2-token match, from alice's last output
    other = RequestDrafter([3, 4], "bob", outputs, cfg)
    other.append([50, 51])
    assert other.propose().tokens == []


def test_a_tenants_outputs_are_bounded_oldest_first() -> None:
    cfg = SpecConfig(tenant_tokens=30, max_tenants=2)
    outputs = TenantOutputs(cfg)
    for i in range(3):
        outputs.add("t", [1000 * i + k for k in range(20)])
    index = outputs.index("t")
    assert index is not None and index.num_tokens == 20  # only the newest fits beside the bound
    outputs.add("u", [1])
    outputs.add("v", [1])
    assert outputs.index("t") is None  # least recently used tenant gone


def test_low_acceptance_pauses_a_request_and_longer_while_it_stays_low() -> None:
    cfg = SpecConfig(max_tokens=4, probation=8, disable_below=0.25, pause_tokens=5, max_pause=16)
    d = RequestDrafter(DOC + DOC[:3], "t", TenantOutputs(cfg), cfg)
    assert d.propose().tokens
    d.record(4, 1)
    assert not d.paused  # a window is 8 drafted tokens
    d.record(4, 0)  # 1 of 8 accepted
    assert d.paused and d.propose().tokens == []
    d.append(DOC[3:7])
    assert d.paused  # 4 of the 5 tokens' pause
    d.append(DOC[7:8])
    assert not d.paused and d.propose().tokens
    d.record(8, 1)  # failing again: twice the pause
    d.append(DOC[8:17])
    assert d.paused
    d.append(DOC[17:18])
    assert not d.paused
    d.record(8, 1)  # 20, capped at max_pause
    assert d.paused_until == len(d.context) + 16
    d.append(DOC[18:34])
    d.record(8, 4)  # a window that passes: no pause, and the next failing one pauses 5 again
    assert not d.paused
    d.record(8, 0)
    assert d.paused_until == len(d.context) + 5
    with pytest.raises(ValueError):
        d.record(2, 3)


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"min_match": 0}, {"min_match": 9, "max_match": 8},
                                    {"min_prob": 0.0}, {"spec_factor": 0.0}, {"pause_tokens": 0},
                                    {"pause_tokens": 9, "max_pause": 8}, {"probation": 0}])
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SpecConfig(**kwargs)  # type: ignore[arg-type]


def test_a_copy_with_edits_is_drafted_past_each_edit() -> None:
    """A reply that counts up a list's items (each item the one before with its number changed): after the
    model writes the new number, the draft goes on from where the last item's number was (the copy
    pointer), not from wherever the last tokens occur in the prompt (which is formatted otherwise)."""
    cfg = SpecConfig(max_tokens=16)

    def item(n: int) -> list[int]:  # `{ "id": n , "title": "task n" }`
        return [50, 51, n, 52, 53, 54, n, 55]

    prompt = [300 + k for k in range(20)] + [49, 51, 7, 56, 57, 58]  # "id" then 7, in the prompt's own format
    d = RequestDrafter(prompt, "t", TenantOutputs(cfg), cfg)
    d.append(item(5) + item(6) + [50, 51])
    assert d.propose().tokens[0] == 6  # the last item's number
    d.append([7])  # the model writes the next one
    assert d.propose().tokens[:5] == [52, 53, 54, 6, 55]  # the last item after its number (the 6 is wrong again)
    plain = RequestDrafter(prompt + item(5) + item(6) + [50, 51, 7], "t", TenantOutputs(cfg), cfg)
    assert plain.propose().tokens[:2] == [56, 57]  # the suffix search alone: the prompt's continuation


def test_accept_chances_learn_where_drafts_break() -> None:
    """The chances a drafted token is kept come from the request's record at its site (the tokens before
    it): where the model always wrote something new (a counter after [1, 2, 3]) they are low, where it
    always went on as proposed they are high, whatever the draft position."""
    cfg = SpecConfig(max_tokens=8)
    block = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    d = RequestDrafter(block + block, "t", TenantOutputs(cfg), cfg)
    assert d.accept_chances([9, 9]) == pytest.approx([0.75, 0.75 ** 2])  # nothing seen: the prior of 3 in 4
    for n in range(8):
        assert len(d.propose().tokens) >= 4  # [1, 2, 3, the last counter, ...]
        d.append([1, 2, 3, 100 + n, 5, 6, 7, 8, 9])
    first, second, third, fourth = d.accept_chances([1, 2, 3, 4])  # after [.., 7, 8, 9]
    assert first > 0.8 and second / first > 0.8 and third / second > 0.8
    assert fourth / third < 0.3


def test_a_reply_repeating_itself_drafts_from_itself_before_its_tenants_outputs() -> None:
    """Where the request's own draft comes from its reply (the reply repeats itself: items of a list it
    writes out), its tenant's outputs are not asked, even when they hold the same match more often (an
    earlier reply of that shape, with its own values); where it comes from the prompt, the more confident
    of the two drafts."""
    cfg = SpecConfig(max_tokens=4)
    outputs = TenantOutputs(cfg)
    earlier = RequestDrafter([1], "t", outputs, cfg)
    earlier.append([60, 61, 62, 63, 70, 60, 61, 62, 63, 71])
    earlier.finish()
    d = RequestDrafter([1], "t", outputs, cfg)
    d.append([60, 61, 90, 91, 5, 60, 61, 95, 96, 6, 60, 61])  # its own: [60, 61] went on with 90, then 95
    assert d.propose().tokens[0] == 95  # the newest of its own occurrences, though the tenant's say 62 twice
    quoting = RequestDrafter([60, 61, 90, 91, 5, 60, 61, 95, 96, 6], "t", outputs, cfg)
    quoting.append([60, 61])  # the same text in the prompt: the tenant's more confident draft wins
    assert quoting.propose().tokens == [62, 63]


def test_a_draft_ends_at_the_end_of_the_reply() -> None:
    """A reply that copies the user's message to its end: the draft stops at the EOS (the reply may end
    there); the turn after it in the context (the template's `assistant` and the last reply) is never
    drafted, from the suffix search or from the copy pointer."""
    eos, turn = 2, [1, 77, 78]  # <|im_end|>, then <|im_start|>assistant\n
    cfg = SpecConfig(max_tokens=16, end_ids=frozenset({eos}))
    quoted = DOC[:30]
    d = RequestDrafter([5] + quoted + [eos] + turn + [300, 301, 302, eos] + turn, "t", TenantOutputs(cfg), cfg)
    d.append(quoted[:20])
    assert d.propose().tokens == quoted[20:30] + [eos]
    d.append(quoted[20:30])
    assert d.propose().tokens == [eos]
    d.append([400])  # the reply goes on past the quote: the copy's place is at the quote's end
    assert eos not in d.propose().tokens[1:]
    without = RequestDrafter([5] + quoted + [eos] + turn, "t", TenantOutputs(SpecConfig(max_tokens=16)),
                             SpecConfig(max_tokens=16))
    without.append(quoted[:20])
    assert without.propose().tokens[10:12] == [eos, 1]  # no end_ids: the draft runs on into the next turn
