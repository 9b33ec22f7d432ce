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


def test_prefill_weights_by_mode_and_size(smollm2_path: Path, tiny_model_dir: Path) -> None:
    f32 = plan.dense_bytes(smollm2_path, torch.float32)
    assert 130e6 * 4 < f32 < 140e6 * 4 and plan.dense_bytes(smollm2_path, torch.bfloat16) == f32 // 2
    assert plan.prefill_mode("auto", "int_dot", smollm2_path, torch.float32, 16) == "dense"  # 0.54 GB: small enough
    assert plan.prefill_mode("dequant", "int_dot", smollm2_path, torch.float32, 16) == "dequant"
    assert plan.prefill_mode("dequant", "torch_int4", smollm2_path, torch.float32, 16) == "dense"  # torch's path keeps dense weights
    assert plan.prefill_mode("dequant", None, smollm2_path, torch.float32, 16) == "dense"
    assert plan.prefill_mode("auto", "int_dot", tiny_model_dir, torch.float32, 16) == "dense"  # a folder is dense
    assert plan.dense_bytes(smollm2_path, torch.float32) <= plan.DENSE_AUTO_BYTES


def _embedding_only_gguf(path: Path, hidden: int) -> Path:
    """A GGUF holding just a token embedding [8, hidden]: what activation_bits reads of a file."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((8, hidden), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_activation_bits_by_mode_and_width(smollm2_path: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    assert plan.activation_bits("auto", smollm2_path) == 16  # 576 wide: SmolLM2 keeps 16-bit activations
    assert plan.activation_bits("auto", tiny_model_dir) == 16
    assert plan.activation_bits("auto", _embedding_only_gguf(tmp_path / "w.gguf", plan.WIDE_HIDDEN)) == 8
    assert plan.activation_bits("auto", _embedding_only_gguf(tmp_path / "n.gguf", plan.WIDE_HIDDEN - 64)) == 16
    assert plan.activation_bits("8", smollm2_path) == 8 and plan.activation_bits("16", tmp_path / "w.gguf") == 16


def test_prefill_mode(smollm2_path: Path) -> None:
    f32 = torch.float32
    assert plan.prefill_mode("auto", "int_dot", smollm2_path, f32, 8) == "int"  # 8 bits: the int kernel wins wide steps too
    assert plan.prefill_mode("auto", "int_dot", smollm2_path, f32, 16) == "dense"
    assert plan.prefill_mode("int", "int_dot", smollm2_path, f32, 16) == "int"
    assert plan.prefill_mode("int", "torch_int4", smollm2_path, f32, 8) == "dense"  # only our kernels run tiles
    assert plan.prefill_mode("auto", None, smollm2_path, f32, 8) == "dense"


def test_head_bits_by_mode_and_activations() -> None:
    assert plan.head_bits("auto", 8) == 4 and plan.head_bits("auto", 16) == 8  # the wide GGUFs: the 4-bit head
    assert plan.head_bits("8", 8) == 8 and plan.head_bits("4", 16) == 4


def test_explicit_requests_the_model_cannot_run_are_refused(tiny_model_dir: Path) -> None:
    from kvstrata import LLM
    from kvstrata.config_flags import ConfigError

    assert plan.unmet_request("8", "auto", True) is None and plan.unmet_request("auto", "auto", False) is None
    for kw, flag in (({"activation_bits": "8"}, "--activation-bits 8"), ({"prefill_weights": "int"}, "--prefill-weights int"),
                     ({"head_bits": "4"}, "--head-bits 4")):
        with pytest.raises(ConfigError, match=f"{flag} needs our integer-dot kernels"):
            LLM(str(tiny_model_dir), max_total_tokens=64, **kw)  # a dense folder: nothing quantized
