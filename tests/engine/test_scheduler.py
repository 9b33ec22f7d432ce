"""Scheduler behaviour on a tiny random-weight model: batching, chunking, budget, preemption, abort.
The order in which a step takes prompts (FCFS, finish-first, priority, slo) is in test_scheduling_order.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvstrata.engine.sampling_params import SamplingParams
from scheduler_support import GREEDY, make, prompts


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> dict[str, list[list[int]]]:
    """Each prompt run alone, unchunked, without prefix caching: the outputs to match."""
    llm = make(tiny_model_dir, enable_prefix_caching=False, chunked_prefill_size=4096,
               max_num_batched_tokens=4096)
    ps = prompts(6)
    return {"prompts": ps, "outputs": [llm.generate([p], GREEDY)[0].token_ids for p in ps]}


def test_batch_matches_one_at_a_time(tiny_model_dir: Path, reference: dict[str, Any]) -> None:
    llm = make(tiny_model_dir)
    outs = llm.generate(reference["prompts"], GREEDY)
    assert [o.token_ids for o in outs] == reference["outputs"]
    llm.engine.check_integrity()


def test_chunked_prefill_and_budget(tiny_model_dir: Path, reference: dict[str, Any]) -> None:
    llm = make(tiny_model_dir, chunked_prefill_size=16, max_num_batched_tokens=40)
    eng = llm.engine
    for i, p in enumerate(reference["prompts"]):
        eng.add_request(f"r{i}", p, GREEDY)
    sizes: list[int] = []
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(reference["prompts"]))}
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        sizes.append(sum(batch.num_tokens))
        assert all(n <= 16 for n in batch.num_tokens)
        for out in eng.postprocess(batch, eng.runner.run(batch)):
            got[out.request_id].extend(out.new_token_ids)
    assert max(sizes) <= 40
    assert [got[f"r{i}"] for i in range(len(got))] == reference["outputs"]
    eng.check_integrity()


def test_arrivals_join_the_running_batch(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    eng = llm.engine
    a, b = prompts(2, 20, 30, seed=3)
    eng.add_request("a", a, GREEDY)
    for _ in range(3):
        eng.step()
    eng.add_request("b", b, GREEDY)
    batch = eng.scheduler.schedule()
    assert [r.request_id for r in batch.requests] == ["a", "b"]
    assert batch.num_tokens == [1, len(b)]  # a decodes while b prefills in the same step
    eng.postprocess(batch, eng.runner.run(batch))
    while eng.has_unfinished():
        eng.step()
    eng.check_integrity()


def test_max_num_seqs_caps_running(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir, max_num_seqs=2)
    eng = llm.engine
    for i, p in enumerate(prompts(5)):
        eng.add_request(f"r{i}", p, GREEDY)
    while eng.has_unfinished():
        eng.step()
        assert eng.num_running <= 2


@pytest.mark.parametrize("caching", [True, False])
def test_preemption_resumes_with_same_output(
    tiny_model_dir: Path, reference: dict[str, Any], caching: bool
) -> None:
    # 15 pages of 16 tokens: six prompts of up to 120 tokens + 24 generated cannot all fit.
    llm = make(tiny_model_dir, max_total_tokens=240, enable_prefix_caching=caching)
    outs = llm.generate(reference["prompts"], GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == reference["outputs"]
    llm.engine.check_integrity()
    if not caching:
        assert llm.engine.pool.num_free == llm.engine.pool.num_pages


def test_abort_frees_pages(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir, enable_prefix_caching=False)
    eng = llm.engine
    for i, p in enumerate(prompts(4, 40, 80)):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    for _ in range(5):
        eng.step()
    assert eng.pool.num_free < eng.pool.num_pages
    out = eng.abort_request("r1")
    assert out is not None and out.finished and out.finish_reason == "abort"
    assert eng.abort_request("r1") is None  # twice is harmless
    eng.check_integrity()
    for rid in ("r0", "r2", "r3"):
        eng.abort_request(rid)
    assert not eng.has_unfinished()
    assert eng.pool.num_free == eng.pool.num_pages
    eng.check_integrity()


def test_seed_gives_same_output_in_any_batch(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    p = prompts(1, seed=7)[0]
    sp = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = llm.generate([p], sp)[0].token_ids
    crowd = llm.generate([p, *prompts(3, seed=8)], sp)[0].token_ids
    assert alone == crowd
    other = llm.generate([p], SamplingParams(**{**sp.__dict__, "seed": 99}))[0].token_ids
    assert other != alone


def test_stop_conditions(tiny_model_dir: Path) -> None:
    llm = make(tiny_model_dir)
    p = prompts(1, seed=11)[0]
    full = llm.generate([p], GREEDY)[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 24
    stop_id = full.token_ids[5]
    first = full.token_ids.index(stop_id)
    by_id = llm.generate([p], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                             stop_token_ids=(stop_id,)))[0]
    assert by_id.finish_reason == "stop" and by_id.token_ids == full.token_ids[: first + 1]
    word = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    if word.strip():
        by_str = llm.generate([p], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                  stop=(word,)))[0]
        assert by_str.finish_reason == "stop"
        assert by_str.text == full.text[: full.text.index(word)]


def test_fcfs_with_a_small_budget_keeps_outputs(tiny_model_dir: Path, reference: dict[str, Any]) -> None:
    """FCFS with a budget smaller than the prompts: same greedy tokens as each prompt alone."""
    llm = make(tiny_model_dir, max_num_batched_tokens=48)
    outs = llm.generate(reference["prompts"], GREEDY)
    assert [o.token_ids for o in outs] == reference["outputs"]
    llm.engine.check_integrity()
