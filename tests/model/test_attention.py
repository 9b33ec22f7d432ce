"""Attention backends inside the engine: `cpu_paged` (our C++ decode kernel) against the plain
`torch_sdpa` path, on a tiny random-weight model in float32 — greedy tokens identical for lone,
batched, cascade-shaped (shared system prompt) and prefix-cache-hit requests — and the choice
of backend (`auto`, bad names)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kvstrata.config_flags import ConfigError
from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model.attention import CpuPagedBackend, TorchSDPABackend, make_attention_backend

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49000) for _ in range(n)]


def run(tiny_model_dir: Path, backend: str, prompts: list[list[int]]) -> tuple[list[list[int]], list[int], str]:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=8192, attention_backend=backend)
    outs = llm.generate(prompts, GREEDY)
    again = llm.generate(prompts[:2], GREEDY)  # served from the prefix cache, decoded over hit pages
    llm.engine.check_integrity()
    return [o.token_ids for o in outs + again], [o.cached_tokens for o in again], type(llm.engine.model.attention).__name__


def test_cpu_paged_decodes_the_same_tokens_as_torch_sdpa(tiny_model_dir: Path) -> None:
    system = tokens(400, seed=1)  # 25 shared pages: torch_sdpa takes its cascade path here
    prompts = [system + tokens(n, seed=10 + n) for n in (5, 37, 90, 200)] + [tokens(3, seed=2), tokens(1100, seed=3)]
    plain, plain_hits, plain_name = run(tiny_model_dir, "torch_sdpa", prompts)
    paged, paged_hits, paged_name = run(tiny_model_dir, "cpu_paged", prompts)
    assert (plain_name, paged_name) == ("TorchSDPABackend", "CpuPagedBackend")
    assert paged == plain
    assert paged_hits == plain_hits and min(paged_hits) > 0


def test_auto_is_cpu_paged_on_cpu() -> None:
    assert isinstance(make_attention_backend("auto", torch.device("cpu")), CpuPagedBackend)
    assert isinstance(make_attention_backend("torch_sdpa", torch.device("cpu")), TorchSDPABackend)


def test_unknown_or_misplaced_backend_is_a_config_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="unknown attention backend"):
        LLM(str(tiny_model_dir), dtype="float32", attention_backend="flash")
    with pytest.raises(ValueError, match="CPU only"):
        make_attention_backend("cpu_paged", torch.device("cuda"))


@pytest.mark.parametrize("n,prefix,heads", [(256, 1, (9, 3)), (300, 700, (9, 3)), (513, 64, (4, 4))])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_prefix_then_causal_equals_the_masked_call(n: int, prefix: int, heads: tuple[int, int],
                                                   dtype: torch.dtype, tol: float) -> None:
    from kvstrata.model.attention import _bottom_right_causal, _prefix_then_causal

    g = torch.Generator().manual_seed(n + prefix)
    h, hkv = heads
    q = torch.randn(1, h, n, 64, generator=g).to(dtype)
    k, v = (torch.randn(1, hkv, prefix + n, 64, generator=g).to(dtype) for _ in range(2))
    mask = _bottom_right_causal(n, prefix + n, q.device)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = _prefix_then_causal(q, k, v, prefix)
    assert got.dtype == dtype and got.shape == want.shape
    assert (got.float() - want.float()).abs().max().item() < tol


def test_long_chunks_over_a_cached_prefix_take_the_split_and_decode_as_uncached(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 300-token suffix over a 704-token cached prefix goes through _prefix_then_causal (once per
    layer) and gives the same greedy tokens as the whole prompt computed with no cache."""
    import kvstrata.model.attention as attention

    calls: list[int] = []
    real = attention._prefix_then_causal
    monkeypatch.setattr(attention, "_prefix_then_causal", lambda q, k, v, p: calls.append(p) or real(q, k, v, p))
    prefix, suffix = tokens(704, 11), tokens(300, 12)
    cached = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=8192, attention_backend="torch_sdpa")
    cached.generate([prefix], SamplingParams(max_tokens=1, temperature=0.0))
    assert not calls  # a whole prompt alone is one causal call
    hit = cached.generate([prefix + suffix], GREEDY)[0]
    assert hit.cached_tokens == 704 and calls == [704] * cached.engine.info.arch.num_layers
    plain = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=8192, enable_prefix_caching=False)
    assert hit.token_ids == plain.generate([prefix + suffix], GREEDY)[0].token_ids
