"""A layer's linears (kvstrata/model/layer_weights.py): the dense weight in oneDNN's blocked layout gives
F.linear's result, and a linear held only quantized runs a wide step on its dequantized weight in a
reused scratch buffer and a narrow step on the kernel."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from quant_support import random_raw

from kvstrata.model import cpu_kernels
from kvstrata.model.cpu_caps import parse_cpuinfo
from kvstrata.model.layer_weights import Linear, Scratch, prepack_dense, prepack_supported
from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import decode_blocks
from kvstrata.model.quant.linear import QuantLinear

FLAGS = parse_cpuinfo(Path("/proc/cpuinfo").read_text())[1]
# where oneDNN's bf16 weight reorder runs (it refuses other CPUs, e.g. AVX2-only ones)
BF16_REORDER = {"avx512bw", "avx512vl", "avx512dq"} <= FLAGS or "avx_ne_convert" in FLAGS


@pytest.mark.parametrize("rows", [9, 133, 700])
@pytest.mark.parametrize("bias", [False, True])  # Qwen2's qkv has one
def test_prepacked_dense_linear_matches_f_linear(rows: int, bias: bool) -> None:
    assert prepack_supported(torch.device("cpu"), torch.bfloat16) == BF16_REORDER
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 64, generator=g).bfloat16()
    x = torch.randn(rows, 64, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16() if bias else None
    if not BF16_REORDER:  # what prepack_supported saw: the models here keep the plain weights
        with pytest.raises(RuntimeError):
            prepack_dense(w)
        return
    packed = prepack_dense(w)
    assert packed.is_mkldnn
    got, want = Linear(packed, None, b)(x, False, Scratch()), torch.nn.functional.linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)  # the same GEMM: bits here



def test_a_quantized_only_linear_dequantizes_into_one_scratch_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_kernels.load_kernels()
    tiles = [int_dot.pack(decode_blocks(random_raw(t, 32, 256, i), t, (32, 256))) for i, t in enumerate(("Q4_K", "Q6_K"))]
    quant = QuantLinear(parts=tiles)
    bias = torch.randn(64)
    lean, dense = Linear(None, quant, bias), Linear(quant.dequantize(torch.float32), quant, bias)
    scratch = Scratch()
    x = torch.randn(20, 256)
    assert torch.equal(lean(x, False, scratch), dense(x, False, scratch))  # wide: the same GEMM on the same values
    buf = scratch.get(1, torch.float32)
    assert buf.numel() == 64 * 256 and lean(x, False, scratch) is not None and scratch.get(1, torch.float32) is buf
    assert torch.equal(lean(x[:2], True, scratch), int_dot.linear(x[:2], tiles) + bias)  # narrow: the kernel
    from kvstrata.model import layer_weights

    monkeypatch.setattr(layer_weights, "SCRATCH_BYTES", 24 * 256 * 4)  # 16 rows at a time: chunks across the parts
    chunked = Scratch()
    assert torch.allclose(lean(x, False, chunked), dense(x, False, scratch), rtol=1e-5, atol=1e-5)
    assert chunked.get(1, torch.float32).numel() == 16 * 256
