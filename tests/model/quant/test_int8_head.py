"""The int8 LM head of narrow steps: the kernel computes what its int8 weights say, the
quantization error stays within its bound, a head built from row chunks equals one built at once,
rescoring reads exact rows from a tensor or a function, and a model without quantized linears keeps
the dense head;
our VNNI kernel (csrc/int8_head.cpp) computes exactly the integer dot products of its quantized
inputs (its portable loops on CPUs without VNNI), and the model uses it exactly where the CPU has it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.attention import make_attention_backend
from kvstrata.model.quant.int8_head import KERNEL_DTYPE, Int8Head
from kvstrata.model.llama import LlamaModel
from kvstrata.model.weights import load_weights


def test_kernel_equals_its_dequantized_weights() -> None:
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(1000, 64, generator=g)
    head = Int8Head.quantize(dense)
    x = torch.randn(3, 64, generator=g).to(KERNEL_DTYPE).float()  # what the kernel sees
    want = x @ (head.weight.float() * head.scales.float()[:, None]).T
    torch.testing.assert_close(head.approx_logits(x), want, atol=2e-2 * want.abs().max().item(), rtol=2e-2)


def test_rescored_top_logits_are_the_dense_ones_and_greedy_agrees() -> None:
    g = torch.Generator().manual_seed(2)
    dense = torch.randn(4000, 64, generator=g)
    head = Int8Head.quantize(dense)
    x = torch.randn(200, 64, generator=g)
    want = x @ dense.T
    got = head.logits(x, dense, rescore=16)
    top = head.approx_logits(x).topk(16, dim=-1).indices
    assert torch.allclose(got.gather(1, top), want.gather(1, top), rtol=1e-5, atol=1e-4)  # exact where rescored
    assert torch.equal(got.argmax(-1), want.argmax(-1))  # greedy = the dense head's choice, row by row
    assert not torch.equal(head.approx_logits(x).argmax(-1), want.argmax(-1))  # which int8 alone misses
    by_rows = head.logits(x, lambda ids: dense[ids], rescore=16)  # exact rows from a source of row ids
    assert torch.equal(by_rows, got)


@pytest.mark.parametrize("int_dot", [False, True])
def test_built_from_row_chunks_equals_built_at_once(int_dot: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstrata.model.quant import int8_head

    dense = torch.randn(16 * 40, 64, generator=torch.Generator().manual_seed(4))
    whole = Int8Head.quantize(dense, int_dot)
    monkeypatch.setattr(int8_head, "CHUNK_ROWS", 48)
    chunked = Int8Head.from_rows(lambda a, b: dense[a:b], 16 * 40, 64, int_dot)
    assert torch.equal(chunked.int8_weight(), whole.int8_weight()) and torch.equal(chunked.scales, whole.scales)
    assert (chunked.pack is not None) == int_dot and (not int_dot or torch.equal(chunked.pack.packed, whole.pack.packed))


def test_quantization_error_within_one_step_per_weight() -> None:
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(500, 64, generator=g) * torch.rand(500, 1, generator=g)  # rows of different scale
    head = Int8Head.quantize(dense)
    deq = head.weight.float() * head.scales.float()[:, None]
    step = dense.abs().amax(1, keepdim=True) / 127
    # half a step from rounding to int8, at most half a step more from holding the scale in bf16 (127 x 2^-8)
    err = (deq - dense).abs() / step
    assert float(err.max()) <= 1.0 and float(err.mean()) < 0.4
    assert head.weight.dtype == torch.int8 and int(head.weight.abs().max()) <= 127
    zero = Int8Head.quantize(torch.zeros(4, 64))  # an all-zero row does not divide by zero
    assert torch.equal(zero.approx_logits(torch.ones(1, 64)), torch.zeros(1, 4))


def test_dense_model_keeps_the_dense_head(tiny_model_dir: Path) -> None:
    w = load_weights(tiny_model_dir)
    model = LlamaModel(w.arch, w.tensors, torch.float32, torch.device("cpu"), make_attention_backend("torch_sdpa"))
    assert model.head.quant is None  # no quantized linears (float32 stays transformers-identical)


def quantized_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What csrc/int8_head.cpp does to x: per row int8, scale max |x| / 127, half to even."""
    scale = x.float().abs().amax(1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x.float() / scale).clamp(-127, 127), scale


@pytest.mark.parametrize("rows", [1, 3, 8, 11])  # 11: a pass of 8 rows and one of 3
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_exact_integer_arithmetic_on_its_quantized_inputs(rows: int, dtype: torch.dtype) -> None:
    assert cpu_kernels.load_kernels()
    g = torch.Generator().manual_seed(rows)
    dense = torch.randn(16 * 37, 96, generator=g)  # 37 blocks of 16: an odd block at the end
    head = Int8Head.quantize(dense, int_dot=True)
    assert head.pack is not None
    x = (torch.randn(rows, 96, generator=g) * 3).to(dtype)
    x[0, :3] = 0.0
    xq, sx = quantized_activations(x)
    assert head.weight.numel() == 0  # our kernel's pack only
    dots = (xq.double() @ head.int8_weight().double().T)  # exact integers
    want = (dots * sx.double() * head.pack.wscale.double()[None, :]).float()
    got = head.approx_logits(x)
    assert got.shape == (rows, 16 * 37) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    # and close to the dense head: int8 weights and activations, each within half a step
    full = x.float() @ dense.T
    assert (got - full).abs().max() < 0.05 * full.abs().max()
    assert torch.equal(head.approx_logits(torch.zeros(2, 96, dtype=dtype)), torch.zeros(2, 16 * 37))


def test_our_kernel_is_used_exactly_where_the_cpu_has_it() -> None:
    from kvstrata.engine.llm import LLM

    gguf = LLM("smollm2", max_total_tokens=512).engine.model  # the default path: int4 linears, int8 head
    assert gguf.head.quant is not None
    assert (gguf.head.quant.pack is not None) == cpu_kernels.int_dot_simd()
    off = LLM("smollm2", max_total_tokens=512, fused_ops="off").engine.model
    assert off.head.quant is not None and off.head.quant.pack is None  # --fused-ops off: torch's kernel
    with pytest.raises(RuntimeError, match="packed holds hidden"):
        torch.ops.kvstrata.int8_head_logits(torch.zeros(1, 8), torch.zeros(1, 3, 16, 4, dtype=torch.int8),
                                            torch.zeros(16, dtype=torch.int32), torch.zeros(16))
