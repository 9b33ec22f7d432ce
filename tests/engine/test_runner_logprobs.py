"""Logprobs and penalties in the engine, float32, against Hugging Face transformers on the same weights:
output and prompt logprobs within 1e-4 of transformers' log-softmax with the prefix cache on and off and
speculation on and off; penalized greedy decoding token-identical to a plain per-token reference; and a
penalized request mixed into a batch of plain ones changes none of them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvstrata.engine.llm import LLM, Completion
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.logprobs import TokenLogprob
from prompt_support import repetitive_prompts

TOL = 1e-4
TOP = 5


def make(model: Path, **kw: Any) -> LLM:
    kw.setdefault("dtype", "float32")
    kw.setdefault("max_total_tokens", 4096)
    return LLM(str(model), **kw)


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    return model.eval()


def hf_logprobs(hf: Any, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row p is log p(token p + 1 | ids[:p + 1])."""
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_entry(entry: TokenLogprob, row: torch.Tensor, token: int, k: int) -> None:
    assert entry.token == token
    assert abs(entry.logprob - float(row[token])) <= TOL
    vals, ids = row.topk(k)
    assert len(entry.top) == k
    for (tid, lp), want_id, want in zip(entry.top, ids.tolist(), vals.tolist()):
        assert abs(lp - want) <= TOL
        assert abs(float(row[tid]) - want) <= TOL  # the same token, or one tied with it within the tolerance
    assert tid == ids.tolist()[-1] or abs(lp - vals.tolist()[-1]) <= TOL


def check_output(hf: Any, prompt: list[int], c: Completion, k: int) -> None:
    lp = hf_logprobs(hf, prompt + c.token_ids)
    assert len(c.logprobs) == len(c.token_ids)
    for j, (entry, tok) in enumerate(zip(c.logprobs, c.token_ids)):
        check_entry(entry, lp[len(prompt) - 1 + j], tok, k)


@pytest.mark.parametrize("kw", [
    {"speculative": "off"},
    {"speculative": "off", "enable_prefix_caching": False},
    {"speculative": "suffix"},
    {"speculative": "ngram", "num_speculative_tokens": 3, "max_num_batched_tokens": 24, "chunked_prefill_size": 8},
])
def test_output_logprobs_match_transformers(tiny_model_dir: Path, hf: Any, kw: dict[str, Any]) -> None:
    llm = make(tiny_model_dir, **kw)
    ps = repetitive_prompts(4, max_repeats=6)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=TOP)
    llm.generate(ps[:2], params)  # warm the prefix cache: the second round's prompts are partly cached
    outs = llm.generate(ps, params)
    for p, c in zip(ps, outs):
        check_output(hf, p, c, TOP)
    if kw["speculative"] == "suffix":  # the repeated rounds' outputs were drafted and verified
        assert llm.engine.spec is not None and llm.engine.spec.totals.accepted > 0
    llm.engine.check_integrity()


@pytest.mark.parametrize("kw", [
    {},
    {"enable_prefix_caching": False},
    {"max_num_batched_tokens": 24, "chunked_prefill_size": 8},  # prompts in several chunks
    {"max_total_tokens": 160, "page_size": 16, "max_num_batched_tokens": 64},  # pages run short: preemption
    {"speculative": "suffix"},  # the outputs' logprobs from verify rows
])
def test_prompt_logprobs_match_transformers_cached_or_not(tiny_model_dir: Path, hf: Any, kw: dict[str, Any]) -> None:
    kw.setdefault("speculative", "off")
    llm = make(tiny_model_dir, **kw)
    ps = repetitive_prompts(4, max_repeats=6, seed=1)
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    echo = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=2)
    llm.generate(ps, plain)  # every prompt is now in the prefix cache (when it is on)
    outs = llm.generate(ps, echo)
    for p, c in zip(ps, outs):
        assert c.cached_tokens == 0  # prompt logprobs are recomputed, never read from cached pages
        assert c.prompt_logprobs is not None and len(c.prompt_logprobs) == len(p) and c.prompt_logprobs[0] is None
        lp = hf_logprobs(hf, p + c.token_ids)
        for pos in range(1, len(p)):
            entry = c.prompt_logprobs[pos]
            assert entry is not None
            check_entry(entry, lp[pos - 1], p[pos], 2)
        check_output(hf, p, c, 1)
    again = llm.generate(ps[:1], plain)[0]  # the echo requests' pages went to the cache like any other's
    if "enable_prefix_caching" not in kw and "max_total_tokens" not in kw:
        assert again.cached_tokens > 0
    llm.engine.check_integrity()


def reference_penalized(hf: Any, prompt: list[int], params: SamplingParams) -> list[int]:
    """Greedy decoding with the penalties written out token by token (transformers' repetition rule, OpenAI's
    presence/frequency formula), on transformers' logits."""
    out: list[int] = []
    for _ in range(params.max_tokens):
        with torch.inference_mode():
            logits = hf(torch.tensor([prompt + out])).logits[0, -1]
        x = logits.float().clone()
        for tok, bias in params.logit_bias:
            x[tok] += bias
        if params.repetition_penalty != 1.0:
            for tok in set(prompt) | set(out):
                x[tok] = x[tok] / params.repetition_penalty if x[tok] > 0 else x[tok] * params.repetition_penalty
        for tok in set(out):
            x[tok] -= params.frequency_penalty * out.count(tok) + params.presence_penalty
        out.append(int(torch.argmax(x)))
    return out


PENALTIES = [
    {"presence_penalty": 1.5},
    {"frequency_penalty": 0.8},
    {"repetition_penalty": 1.6},
    {"repetition_penalty": 0.7, "frequency_penalty": -0.5},
    {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.3, "logit_bias": {7: 1.5, 99: -100}},
    {"logit_bias": {11: 2.0, 500: 1.0}},
]


@pytest.mark.parametrize("spec", ["off", "suffix"])
def test_penalized_greedy_matches_a_per_token_reference(tiny_model_dir: Path, hf: Any, spec: str) -> None:
    llm = make(tiny_model_dir, speculative=spec)
    ps = repetitive_prompts(len(PENALTIES), seed=2, max_repeats=6)
    plain = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    plain_before = [c.token_ids for c in llm.generate(ps, plain)]
    for p, pen in zip(ps, PENALTIES):  # each penalized request in a batch with every plain one
        params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2, **pen)  # type: ignore[arg-type]
        ours = llm.generate([p], params)[0]
        assert ours.token_ids == reference_penalized(hf, p, params), pen
        check_output(hf, p, ours, 2)  # logprobs stay the model's own: the penalties do not change them
    assert [c.token_ids for c in llm.generate(ps, plain)] == plain_before
    llm.engine.check_integrity()


def test_penalties_in_one_batch_with_plain_rows(tiny_model_dir: Path, hf: Any) -> None:
    """Penalized and plain requests in the same steps: each as it is alone."""
    llm = make(tiny_model_dir, speculative="suffix")
    ps = repetitive_prompts(len(PENALTIES) * 2, seed=3, max_repeats=6)
    reqs = [SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, **(PENALTIES[i // 2] if i % 2 else {}))  # type: ignore[arg-type]
            for i in range(len(ps))]
    eng = llm.engine
    for i, (p, params) in enumerate(zip(ps, reqs)):
        eng.add_request(f"r{i}", p, params)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(ps))}
    verified = 0  # drafted tokens of penalized requests: their verify rows carry the penalties per position
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        eng.spec.draft(batch, eng.scheduler.kv, 1000)
        verified += sum(len(batch.draft(i)) for i, r in enumerate(batch.requests) if r.params.penalized)
        for out in eng.postprocess(batch, eng.runner.run(batch)):
            got[out.request_id].extend(out.new_token_ids)
    assert verified > 0
    for i, (p, params) in enumerate(zip(ps, reqs)):
        assert got[f"r{i}"] == reference_penalized(hf, p, params), (i, params)


def test_seeded_sampling_with_penalties_is_the_same_with_speculation(tiny_model_dir: Path) -> None:
    ps = repetitive_prompts(4, max_repeats=6, seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.8, top_k=40, min_p=0.05, seed=123, ignore_eos=True,
                            presence_penalty=0.5, repetition_penalty=1.2)
    off = [c.token_ids for c in make(tiny_model_dir, speculative="off").generate(ps, params)]
    on = [c.token_ids for c in make(tiny_model_dir, speculative="suffix").generate(ps, params)]
    assert on == off
