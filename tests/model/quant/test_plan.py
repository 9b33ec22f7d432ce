"""Which quantized path a model runs (kvstrata/model/quant/plan.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstrata.model.quant import plan

CPU = torch.device("cpu")


def test_q4_decode_mode() -> None:
    assert plan.q4_decode_wanted("auto", CPU, torch.bfloat16)
    assert not plan.q4_decode_wanted("auto", CPU, torch.float32)  # float32 stays transformers-identical
    assert plan.q4_decode_wanted("auto", CPU, torch.float32, auto_on=True)  # --dtype auto chose float32 prefill
    assert not plan.q4_decode_wanted("auto", CPU, torch.bfloat16, auto_on=False)
    assert not plan.q4_decode_wanted("off", CPU, torch.bfloat16)
    assert plan.q4_decode_wanted("on", CPU, torch.float32)
    with pytest.raises(ValueError, match="--q4-decode on"):
        plan.q4_decode_wanted("on", CPU, torch.float16)
    assert not plan.q4_decode_wanted("auto", torch.device("cuda"), torch.bfloat16)


def test_keep_dense_by_mode_and_size(smollm2_path: Path, tiny_model_dir: Path) -> None:
    f32 = plan.dense_bytes(smollm2_path, torch.float32)
    assert 130e6 * 4 < f32 < 140e6 * 4 and plan.dense_bytes(smollm2_path, torch.bfloat16) == f32 // 2
    assert plan.keep_dense("auto", "int_dot", smollm2_path, torch.float32)  # 0.54 GB: small enough
    assert not plan.keep_dense("dequant", "int_dot", smollm2_path, torch.float32)
    assert plan.keep_dense("dequant", "torch_int4", smollm2_path, torch.float32)  # torch's path keeps dense weights
    assert plan.keep_dense("dequant", None, smollm2_path, torch.float32)
    assert plan.keep_dense("auto", "int_dot", tiny_model_dir, torch.float32)  # a folder is dense
    assert plan.dense_bytes(smollm2_path, torch.float32) <= plan.DENSE_AUTO_BYTES
