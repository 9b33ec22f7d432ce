"""The int4 decode path: GGUF Q4 blocks read exactly, packed for torch's kernel, and a model whose
narrow steps run on them gives the dense model's logits."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvstrata.kv.pool import PagePool
from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend
from kvstrata.model.llama import LlamaModel
from kvstrata.model.q4_weights import PackedInt4, Q4Weight, q4_decode_wanted, read_q4
from kvstrata.model.weights import load_weights

CPU = torch.device("cpu")


def _quantize(w: torch.Tensor, kind: str) -> tuple[Q4Weight, torch.Tensor]:
    """(our Q4Weight, gguf's own dequantization) of w [N, K] quantized by the gguf package."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[kind]
    raw = quantize(w.numpy().astype(np.float32), qtype)  # [N, bytes per row]
    q4 = read_q4(raw, kind, tuple(w.shape))
    assert q4 is not None
    return q4, torch.from_numpy(dequantize(raw, qtype).astype(np.float32))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_read_q4_equals_gguf_dequantize(kind: str) -> None:
    torch.manual_seed(0)
    q4, ref = _quantize(torch.randn(48, 128), kind)
    assert q4.q.dtype == torch.uint8 and int(q4.q.max()) <= 15
    assert torch.equal(q4.dequantize(), ref)  # bit-exact: the same values the dense path holds


def test_read_q4_declines_other_types() -> None:
    assert read_q4(np.zeros((4, 34), np.uint8), "Q8_0", (4, 32)) is None
    assert read_q4(np.zeros((4, 20), np.uint8), "Q4_1", (4, 16)) is None  # K not a multiple of 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_dense(dtype: torch.dtype) -> None:
    """The kernel runs on bf16 activations for either model dtype (float32 casts around it), so
    both get bf16's tolerance, and the output comes back in the model's dtype."""
    tol = 5e-2
    torch.manual_seed(1)
    (a, da), (b, db) = _quantize(torch.randn(64, 96), "Q4_1"), _quantize(torch.randn(32, 96), "Q4_0")
    packed = PackedInt4.from_q4([a, b], dtype)  # row-concatenated, as the fused qkv / gate_up are
    x = torch.randn(3, 96)
    want = x @ torch.cat([da, db]).t()
    out = packed.linear(x.to(dtype))
    assert out.dtype == dtype and packed.scale_zero.dtype == torch.bfloat16
    got = out.float()
    assert got.shape == (3, 96) and packed.out_features == 96
    torch.testing.assert_close(got, want, atol=tol * want.abs().max().item(), rtol=tol)


def test_real_gguf_q4_equals_its_dense_weights(smollm2_path: Path) -> None:
    w = load_weights(smollm2_path, keep_q4=True)
    assert len(w.q4) == 7 * w.arch.num_layers  # every linear of SmolLM2 is Q4_1; the embedding is Q8_0
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.7.self_attn.k_proj.weight",
                 "model.layers.29.mlp.down_proj.weight"):
        assert torch.equal(w.q4[name].dequantize(), w.tensors[name]), name  # q/k: row order undone too
    assert not load_weights(smollm2_path).q4


def test_decode_steps_on_int4_match_dense_logits(tiny_model_dir: Path) -> None:
    """A model whose dense weights are Q4 values: decode rows through int4 == dense, in float32
    (up to the bf16 rounding of the activations the int4 kernel takes)."""
    w = load_weights(tiny_model_dir)
    q4: dict[str, Q4Weight] = {}
    for name, t in w.tensors.items():
        if name.endswith("proj.weight"):
            q4[name], w.tensors[name] = _quantize(t, "Q4_1")
    a = w.arch
    attn = make_attention_backend("torch_sdpa")
    dense = LlamaModel(a, w.tensors, torch.float32, CPU, attn)
    # torch's norms in both (fused ops, on by default off the exact path, round differently)
    int4 = LlamaModel(a, w.tensors, torch.float32, CPU, attn, q4=q4, q4_max_rows=1, fused_ops=False)
    assert int4.uses_int4 and not dense.uses_int4
    ps, pages = 4, [3, 1, 6]
    ids = torch.randint(0, a.vocab_size, (9,))
    slots = torch.tensor([pages[p // ps] * ps + p % ps for p in range(9)])
    logits = []
    for model in (dense, int4):
        pool = PagePool(8, ps, a.num_layers, a.num_kv_heads, a.head_dim, torch.float32)
        n = 8  # an 8-row prefill (wider than q4_max_rows: dense in both) then one decode row
        meta = AttentionMetadata(ps, slots[:n], [PrefillSeq(0, n, n, torch.tensor(pages[:2]))])
        prefill = model.forward(ids[:n], torch.arange(n), meta, pool.k, pool.v, torch.arange(n))
        meta = AttentionMetadata(ps, slots[n:], [], decode_rows=torch.tensor([0]), decode_pages=torch.tensor([pages]),
                                 decode_mask=(torch.arange(3 * ps) <= n)[None, None, None, :], decode_lens=[n + 1])
        decode = model.forward(ids[n:], torch.tensor([n]), meta, pool.k, pool.v, torch.tensor([0]))
        logits.append((prefill, decode))
    assert torch.equal(logits[0][0], logits[1][0])  # the wide step did not touch the int4 weights
    want = logits[0][1]
    torch.testing.assert_close(logits[1][1], want, atol=2e-2 * want.abs().max().item(), rtol=2e-2)


def test_q4_decode_mode() -> None:
    assert q4_decode_wanted("auto", CPU, torch.bfloat16)
    assert not q4_decode_wanted("auto", CPU, torch.float32)  # float32 stays transformers-identical
    assert q4_decode_wanted("auto", CPU, torch.float32, auto_on=True)  # --dtype auto chose float32 prefill
    assert not q4_decode_wanted("auto", CPU, torch.bfloat16, auto_on=False)
    assert not q4_decode_wanted("off", CPU, torch.bfloat16)
    assert q4_decode_wanted("on", CPU, torch.float32)
    with pytest.raises(ValueError, match="--q4-decode on"):
        q4_decode_wanted("on", CPU, torch.float16)
    assert not q4_decode_wanted("auto", torch.device("cuda"), torch.bfloat16)


def test_q4_decode_on_needs_q4_weights(tiny_model_dir: Path) -> None:
    from kvstrata import LLM
    from kvstrata.config import ConfigError

    with pytest.raises(ConfigError, match="no Q4_0/Q4_1 linears"):
        LLM(str(tiny_model_dir), q4_decode="on", max_total_tokens=64)


def vnni_reference(x: torch.Tensor, q4: Q4Weight) -> torch.Tensor:
    """What csrc/int4_linear.cpp computes, in float64: x per block of 32 to 16-bit integers (max |x|
    / 32639, half to even), integer dots with the 4-bit values, then scale and bias (float16, as packed)."""
    rows, K = x.shape
    xb = x.double().view(rows, K // 32, 32)
    bound = 127 * 256 + 127
    sx = (xb.float().abs().amax(-1) / bound).double()
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    xq = torch.round((xb.float() / sx.float()[..., None]).double()).clamp(-bound, bound)
    idot = torch.einsum("rjt,njt->rnj", xq, q4.q.double().view(-1, K // 32, 32))
    scale, bias = q4.scale.half().double(), (q4.zero - 8 * q4.scale).half().double()
    return (idot * scale[None] * sx[:, None, :]).sum(-1) + torch.einsum("rj,nj->rn", xb.float().sum(-1).double(), bias)


@pytest.mark.parametrize("rows", [1, 5, 8, 13])  # 13: a pass of 8 rows and one of 5
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_vnni_kernel_is_exact_integer_arithmetic_on_its_quantized_inputs(rows: int, kind: str) -> None:
    from kvstrata.model import cpu_kernels

    assert cpu_kernels.load_kernels()
    torch.manual_seed(rows)
    (a, da), (b, db) = _quantize(torch.randn(48, 96), kind), _quantize(torch.randn(32, 96), kind)
    packed = PackedInt4.from_q4([a, b], torch.float32, vnni=True)
    assert packed.vnni is not None and packed.out_features == 80
    x = torch.randn(rows, 96) * 2
    x[0, :32] = 0.0  # an all-zero block
    both = Q4Weight(torch.cat([a.q, b.q]), torch.cat([a.scale, b.scale]), torch.cat([a.zero, b.zero]))
    want = vnni_reference(x, both)
    got = packed.linear(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 80)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    dense = x @ torch.cat([da, db]).t()  # and the dense weights' result, up to float16 scales and 16-bit inputs
    assert (got - dense).abs().max() < 2e-3 * dense.abs().max()
    half = packed.linear(x.bfloat16())  # a bf16 model's activations: the output in bf16, one rounding
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.double(), vnni_reference(x.bfloat16().float(), both), rtol=1e-2, atol=1e-2)
    alone = torch.cat([packed.linear(x[i : i + 1]) for i in range(rows)])
    assert torch.equal(alone, got)  # a row's result does not depend on the rows beside it


def test_vnni_linears_are_used_exactly_where_the_cpu_has_them() -> None:
    from kvstrata.engine.llm import LLM
    from kvstrata.model import cpu_kernels

    model = LLM("smollm2", max_total_tokens=512).engine.model
    layer = model.layers[0].int4
    assert layer is not None and model.uses_vnni == cpu_kernels.int_dot_simd()
    assert (layer.gate_up.vnni is not None) == model.uses_vnni
    off = LLM("smollm2", max_total_tokens=512, fused_ops="off").engine.model
    assert not off.uses_vnni and off.layers[0].int4 is not None and off.layers[0].int4.qkv.vnni is None
    with pytest.raises(RuntimeError, match="packed holds in_features"):
        torch.ops.kvstrata.int4_linear(torch.zeros(1, 64), torch.zeros(1, 3, 320, dtype=torch.uint8))
