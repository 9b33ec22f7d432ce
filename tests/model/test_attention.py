"""Attention backends inside the engine: `cpu_paged` (our C++ decode kernel) against the plain
`torch_sdpa` path, on a tiny random-weight model in float32 — greedy tokens identical for lone,
batched, cascade-shaped (shared system prompt) and prefix-cache-hit requests — and the choice
of backend (`auto`, bad names)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kvstrata.config import ConfigError
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
