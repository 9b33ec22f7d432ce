"""The integer-dot kernels on packed GGUF blocks (kvstrata/model/quant/int_dot.py, csrc/int_dot_*.cpp):
packing keeps every value (up to the float16 rounding of products like Q4_K's d * sc), the linear op is
exact integer arithmetic on its quantized activations for every format, alone and mixed in one call,
and the dequant op gives the packed values back."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from quant_support import random_raw

from kvstrata.model import cpu_kernels
from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import BLOCK_TYPES, SYMMETRIC, IntWeight, decode_blocks

TYPES = sorted(BLOCK_TYPES)


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


def weight(type_name: str, n: int, k: int, seed: int = 0) -> IntWeight:
    return decode_blocks(random_raw(type_name, n, k, seed), type_name, (n, k))


def halved(w: IntWeight) -> IntWeight:
    """w with its scales and biases rounded to float16, as packed (a symmetric type's bias: -zero times
    the rounded scale; Q4_K's q4k keeps the file's d, dmin, sc and m: its products are exact)."""
    if w.kscales is not None:
        return w
    scale = w.scale.half().float()
    bias = -w.zero * scale if w.zero else w.bias.half().float()
    return IntWeight(w.q, scale, bias, w.bits, w.group, w.zero)


def reference(x: torch.Tensor, w: IntWeight, bits: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """What csrc/int_dot_linear.cpp computes, in float64: x per block of 32 to 16-bit integers (max |x|
    / 32639, half to even; 8-bit: max |x| / 127), integer dots with q per group, then scale * sx and
    bias * (the group's sum of x); and the sum of the terms' magnitudes (what bounds the kernel's float32
    rounding)."""
    rows, K = x.shape
    bound = 127 * 256 + 127 if bits == 16 else 127
    xb = x.float().view(rows, K // 32, 32)
    sx = xb.abs().amax(-1) / bound
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    xq = torch.round(xb / sx[..., None]).clamp(-bound, bound).double().view(rows, K)
    g = w.group
    idot = torch.einsum("rjt,njt->rnj", xq.view(rows, K // g, g), w.q.double().view(-1, K // g, g))
    sx_g = sx.double().repeat_interleave(32 // g, dim=1)  # [rows, K / g]
    xsum = x.float().view(rows, K // g, g).sum(-1).double()
    h = halved(w)
    terms = idot * h.scale.double()[None] * sx_g[:, None, :]
    return terms.sum(-1) + xsum @ h.bias.double().T, terms.abs().sum(-1) + xsum.abs() @ h.bias.double().abs().T


def assert_matches(got: torch.Tensor, x: torch.Tensor, w: IntWeight, tol: float, bits: int = 16) -> None:
    want, magnitude = reference(x, w, bits)
    assert ((got.double() - want).abs() <= tol * magnitude + 1e-30).all()


@pytest.mark.parametrize("type_name", TYPES)
def test_packing_keeps_the_values(type_name: str) -> None:
    w = weight(type_name, 48, 512, seed=1)
    packed = int_dot.pack(w)
    _, _, bits, _ = BLOCK_TYPES[type_name]
    size = int_dot.Q4K_BYTES if type_name == "Q4_K" else int_dot.tile_bytes(bits, type_name in SYMMETRIC)
    assert packed.shape == (3, 16, size) and packed.dtype == torch.uint8
    per_weight = {"Q4_0": 4.5, "Q5_0": 5.5, "Q8_0": 8.5, "Q6_K": 7.0, "Q4_1": 5.0, "Q4_K": 4.625, "Q5_1": 6.0, "Q5_K": 6.0}
    assert packed.shape[2] * 8 / 512 == per_weight[type_name]
    dense = int_dot.dequantize(packed, torch.float32)
    want = halved(w)
    assert torch.equal(dense, torch.addcmul(want.bias.repeat_interleave(w.group, 1),
                                            want.scale.repeat_interleave(w.group, 1), w.q.float()))
    exact = type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K")  # the file's own float16s (Q4_K: and bytes)
    assert torch.equal(dense, w.dequantize()) == exact
    if not exact:
        assert (dense - w.dequantize()).abs().max() <= w.dequantize().abs().max() * 2**-10
    rows = torch.tensor([47, 0, 17, 17])
    assert torch.equal(int_dot.dequantize(packed, torch.float32, rows=rows), dense[rows])
    assert torch.equal(int_dot.dequantize(packed, torch.bfloat16), dense.bfloat16())


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 13])  # 13: a pass of 8 rows and one of 5
@pytest.mark.parametrize("type_name", TYPES)
def test_linear_is_exact_integer_arithmetic(type_name: str, rows: int) -> None:
    w = weight(type_name, 64, 256, seed=rows)
    packed = int_dot.pack(w)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 256, generator=g) * 2
    x[0, :32] = 0.0  # an all-zero block
    got = int_dot.linear(x, [packed])
    assert got.dtype == torch.float32 and got.shape == (rows, 64)
    assert_matches(got, x, w, 1e-6)  # float32 sums of exact integer dots
    alone = torch.cat([int_dot.linear(x[i:i + 1], [packed]) for i in range(rows)])
    assert torch.equal(alone, got)  # a row's result does not depend on the rows beside it
    half = int_dot.linear(x.bfloat16(), [packed])  # a bf16 model's activations: the output in bf16
    assert half.dtype == torch.bfloat16
    assert_matches(half.float(), x.bfloat16().float(), w, 1e-2)


@pytest.mark.parametrize("rows", [1, 3, 8, 13])
@pytest.mark.parametrize("type_name", TYPES)
def test_8_bit_activations_are_exact_integer_arithmetic_too(type_name: str, rows: int) -> None:
    """--activation-bits 8: one byte a value (llama.cpp's Q8 activations, per block of 32), the same
    float steps; further from float than 16 bits, but each row alone as in a batch."""
    w = weight(type_name, 64, 256, seed=rows + 100)
    packed = int_dot.pack(w)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)) * 2
    x[0, :32] = 0.0
    got = int_dot.linear(x, [packed], 8)
    assert_matches(got, x, w, 1e-6, bits=8)
    assert torch.equal(torch.cat([int_dot.linear(x[i:i + 1], [packed], 8) for i in range(rows)]), got)
    exact = x @ halved(w).dequantize().T
    err8, err16 = (got - exact).abs().max(), (int_dot.linear(x, [packed]) - exact).abs().max()
    assert err16 < err8 < 0.05 * exact.abs().max()  # 8 bits: the coarser, still close
    with pytest.raises(RuntimeError, match="act_bits: 8 or 16, not 12"):
        int_dot.linear(x, [packed], 12)


def test_parts_of_several_types_in_one_call() -> None:
    """A Q4_K_M layer's fused q/k/v: Q4_K, Q4_K and Q6_K parts, one activation quantization."""
    parts = [weight("Q4_K", 32, 512, 1), weight("Q4_K", 16, 512, 2), weight("Q6_K", 16, 512, 3), weight("Q8_0", 48, 512, 4)]
    packed = [int_dot.pack(p) for p in parts]
    x = torch.randn(4, 512)
    got = int_dot.linear(x, packed)
    want = torch.cat([int_dot.linear(x, [p]) for p in packed], dim=1)
    assert got.shape == (4, 112) and torch.equal(got, want)


def test_bad_inputs_are_refused() -> None:
    packed = int_dot.pack(weight("Q4_0", 16, 64))
    with pytest.raises(RuntimeError, match="packed holds in_features 64, x has 96"):
        int_dot.linear(torch.zeros(1, 96), [packed])
    with pytest.raises(RuntimeError, match="tile bytes 300"):
        int_dot.linear(torch.zeros(1, 64), [torch.zeros(1, 2, 300, dtype=torch.uint8)])
    with pytest.raises(RuntimeError, match="outside the weight's 16 rows"):
        int_dot.dequantize(packed, torch.float32, rows=torch.tensor([16]))
    with pytest.raises(ValueError, match=r"shape \[8, 64\]"):
        int_dot.pack(weight("Q4_0", 8, 64))
    big = weight("Q4_0", 16, 64)
    big.scale[0, 0] = 1e6  # past float16
    with pytest.raises(ValueError, match="overflows float16"):
        int_dot.pack(big)


@pytest.mark.parametrize("rows", [3, 9, 16, 21])  # 3, 8 of 9: in registers (9th: planes); 16, 21: the column rebuilt
def test_q8_rows_on_signed_bytes_give_the_bits_of_one_row(rows: int) -> None:
    """Q8_0 at 8-bit activations, 3 rows or more: q as signed bytes q - 128 times the sign trick
    (csrc/int_dot_q8_bytes.h), rebuilt in registers a pass or, from 16 rows, once for the tile column; a
    row alone takes the nibble planes. The same integers, so the same bits, at the bounds too: q = 0 and
    255 (|q - 128| up to 128) against blocks of +-127 (pairs of products at 32,512, under int16's 32,767)."""
    w = weight("Q8_0", 32, 2048, seed=rows)
    w.q[0], w.q[1], w.q[2, ::2] = 0, 255, 0
    packed = int_dot.pack(w)
    x = torch.randn(rows, 2048, generator=torch.Generator().manual_seed(rows))
    x[0] = 3.0  # every block at +127
    x[1, :1024], x[1, 1024:] = -2.0, 5.0
    x[2, :32] = 0.0
    got = int_dot.linear(x, [packed], 8)
    assert_matches(got, x, w, 1e-6, bits=8)
    assert torch.equal(torch.cat([int_dot.linear(x[i:i + 1], [packed], 8) for i in range(rows)]), got)
    assert torch.equal(int_dot.linear(x, [packed, packed], 8), torch.cat([got, got], dim=1))  # columns on


@pytest.mark.parametrize("type_name", sorted(SYMMETRIC))
def test_symmetric_formats_give_the_bits_of_stored_biases(type_name: str) -> None:
    """Q4_0, Q5_0, Q6_K, Q8_0 pack without biases (bias = scale * -zero in the kernels): the same outputs,
    bit for bit, as the same weight packed with its biases, in fewer bytes."""
    w = weight(type_name, 64, 512, seed=5)
    assert w.zero == SYMMETRIC[type_name] == 1 << (w.bits - 1)
    assert torch.equal(w.bias, -w.zero * w.scale)
    sym, stored = int_dot.pack(w), int_dot.pack(IntWeight(w.q, w.scale, w.bias, w.bits, w.group))
    assert sym.shape[2] == stored.shape[2] - 32 * (2 if w.bits == 6 else 1)
    assert int_dot.format_name(sym) == int_dot.format_name(stored) + "s"
    for rows in (1, 2, 3, 5, 8, 13):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)) * 2
        for bits in (16, 8):
            assert torch.equal(int_dot.linear(x, [sym], bits), int_dot.linear(x, [stored], bits))
        assert torch.equal(int_dot.linear(x.bfloat16(), [sym]), int_dot.linear(x.bfloat16(), [stored]))
    assert torch.equal(int_dot.dequantize(sym, torch.float32), int_dot.dequantize(stored, torch.float32))
    wrong = 16 if w.bits != 5 else 8
    with pytest.raises(ValueError, match=f"zero {wrong} "):
        int_dot.pack(IntWeight(w.q, w.scale, w.bias, w.bits, w.group, wrong))


@pytest.mark.parametrize("type_name", ["Q6_K", "Q4_K"])
def test_pack_in_chunks_equals_pack_at_once(monkeypatch: pytest.MonkeyPatch, type_name: str) -> None:
    w = weight(type_name, 96, 512, 7)
    whole = int_dot.pack(w)
    raw = int_dot.pack_raw(random_raw(type_name, 96, 512, 7), type_name, (96, 512))
    monkeypatch.setattr(int_dot, "PACK_ROWS", 32)
    assert torch.equal(int_dot.pack(w), whole) and torch.equal(raw, whole)


def test_q4k_keeps_the_files_scales_and_rows() -> None:
    """Q4_K as q4k: rows taken out of order (llama.cpp's Q/K order undone) keep their scales; the same
    outputs as the q4 tiles of the same values where float16 holds d * sc exactly."""
    w = weight("Q4_K", 48, 768, seed=3)
    ks = w.kscales
    assert ks is not None and ks.sc.dtype == torch.uint8 and int(ks.sc.max()) < 64
    assert torch.equal(w.scale, ks.d.repeat_interleave(8, 1) * ks.sc.float())
    assert torch.equal(w.bias, -ks.dmin.repeat_interleave(8, 1) * ks.m.float())
    index = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    packed = int_dot.pack(w.rows(index))
    assert int_dot.format_name(packed) == "q4k"
    assert torch.equal(int_dot.dequantize(packed, torch.float32), w.dequantize()[index])
    x = torch.randn(5, 768, generator=torch.Generator().manual_seed(1))
    assert_matches(int_dot.linear(x, [packed]), x, w.rows(index), 1e-6)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        int_dot.linear(torch.zeros(1, 224), [packed[:, :7].contiguous()])


def portable_outputs() -> dict[str, torch.Tensor]:
    """Every format's linear over 1..9 rows and its dequantized rows, seeded: compared across builds."""
    out = {}
    for i, type_name in enumerate(TYPES):
        packed = int_dot.pack(weight(type_name, 32, 256, i))
        x = torch.from_numpy(np.random.default_rng(i).standard_normal((9, 256)).astype(np.float32))
        for rows in (1, 2, 4, 5, 9):
            out[f"{type_name} rows={rows}"] = int_dot.linear(x[:rows], [packed])
            out[f"{type_name} rows={rows} 8-bit"] = int_dot.linear(x[:rows], [packed], 8)
        out[f"{type_name} dense"] = int_dot.dequantize(packed, torch.float32)
    return out


@pytest.mark.parametrize("type_name,k", [("Q4_K", 2048), ("Q6_K", 4096), ("Q8_0", 4096), ("Q5_K", 2048)])
def test_linear_at_real_widths(type_name: str, k: int) -> None:
    w = weight(type_name, 32, k, seed=k)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(k))
    got = int_dot.linear(x, [int_dot.pack(w)])
    assert_matches(got, x, w, 1e-6)
