"""load_model (kvstrata/engine/model_loader.py): the plan's dtype and kernels, flags it refuses, and KV layout
names that keep pages of different numerics apart."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstrata.config import ModelConfig
from kvstrata.config_flags import ConfigError
from kvstrata.engine.model_loader import kv_layout, load_model


def test_float32_folder_loads_dense_with_its_layout(tiny_model_dir: Path) -> None:
    loaded = load_model(ModelConfig(model=str(tiny_model_dir), dtype="float32", fused_ops="off"))
    assert loaded.dtype == torch.float32 and loaded.dtype_name == "float32"
    assert loaded.path == tiny_model_dir.resolve() and loaded.model.arch.num_layers == 2
    assert not loaded.model.uses_quant and loaded.tokenizer.encode("hello")
    layout = kv_layout(loaded)
    assert layout.startswith("llama-paged-v1") and "+q4decode" not in layout and "+fusedops" not in layout


def test_quantized_gguf_runs_its_blocks_in_its_own_namespace(smollm2_path: Path) -> None:
    """Our fused ops and integer kernels round otherwise than torch's path: their pages never meet its."""
    fused = load_model(ModelConfig(model=str(smollm2_path), dtype="float32", q4_decode="on"))
    plain = load_model(ModelConfig(model=str(smollm2_path), dtype="float32", q4_decode="on", fused_ops="off"))
    assert fused.model.uses_quant and plain.model.uses_quant
    assert "+q4decode" in kv_layout(fused) and "+fusedops" in kv_layout(fused) and "+intdot" in kv_layout(fused)
    assert "+q4decode" in kv_layout(plain) and "+fusedops" not in kv_layout(plain)


@pytest.mark.parametrize("extra,needle", [
    (dict(attention_backend="no-such-backend"), "--attention-backend no-such-backend"),
    (dict(q4_decode="on"), "--q4-decode on"),
])
def test_refused_flags_name_themselves(tiny_model_dir: Path, extra: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_model(ModelConfig(model=str(tiny_model_dir), dtype="float32", **extra))
