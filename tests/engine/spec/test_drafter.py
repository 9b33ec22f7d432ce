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


def test_low_acceptance_turns_a_request_off() -> None:
    cfg = SpecConfig(max_tokens=4, probation=8, disable_below=0.25)
    d = RequestDrafter(DOC + DOC[:3], "t", TenantOutputs(cfg), cfg)
    assert d.propose().tokens
    d.record(4, 1)
    d.record(4, 0)  # 1 of 8 accepted
    assert d.disabled and d.propose().tokens == []
    with pytest.raises(ValueError):
        d.record(2, 3)


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"min_match": 0}, {"min_match": 9, "max_match": 8},
                                    {"min_prob": 0.0}, {"spec_factor": 0.0}])
def test_bad_config_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SpecConfig(**kwargs)  # type: ignore[arg-type]


def test_accept_chances_learn_per_position() -> None:
    from kvstrata.engine.spec.drafter import SpecStats

    s = SpecStats()
    assert s.accept_chances(2) == [0.75, 0.75 * 0.75]  # the prior
    for _ in range(20):  # copies: once the first token passes, the rest do
        s.add_step(4, 4)
    for _ in range(20):
        s.add_step(4, 0)
    first, second, third, fourth = s.accept_chances(4)
    assert first == pytest.approx((20 + 3) / (40 + 4)) and second == pytest.approx(first * (20 + 3) / (20 + 4))
    assert fourth / third > 0.95 > first  # agreement at a later position, given the earlier ones: near certain
    assert s.tried == [40, 20, 20, 20] and s.passed == [20, 20, 20, 20]
