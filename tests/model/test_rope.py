"""rope.py's tables equal transformers' rotary embeddings, scaled (linear, llama3, yarn) or not."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.rope import rope_tables

BASE = dict(vocab_size=64, hidden_size=256, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=128, max_position_embeddings=8192)


@pytest.mark.parametrize("params", [
    {"rope_type": "default", "rope_theta": 1000000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 2048},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 1024,
     "beta_fast": 16, "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 1.0, "mscale_all_dim": 0.707},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 2048,
     "attention_factor": 1.5},
])
def test_tables_equal_transformers(params: dict[str, Any]) -> None:
    import transformers as tf
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    config = tf.Qwen3Config(**BASE, rope_parameters=params)
    arch = ModelArch.from_hf_config({**config.to_dict(), "architectures": ["Qwen3ForCausalLM"]})
    cos, sin = rope_tables(arch, "cpu")
    positions = torch.tensor([[0, 1, 17, 1000, 2047, 2048, 5000, 8191]])
    want_cos, want_sin = Qwen3RotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(cos[positions[0]], want_cos[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(sin[positions[0]], want_sin[0], atol=2e-5, rtol=1e-5)
