"""The fused CPU ops (kvstrata/model/csrc/rms_norm.cpp, rope_store.cpp) against the torch ops they
replace, and where the model uses them: never for float32 on dense weights (bound to match
transformers), on CPU otherwise, with its own KV namespace."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.model import cpu_kernels
from kvstrata.model.llama import rms_norm, rotate_half

EPS = 1e-5


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_matches_torch(dtype: torch.dtype, tol: float, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 576, generator=g) * 3).to(dtype)
    w = torch.randn(576, generator=g).to(dtype)
    torch.testing.assert_close(cpu_kernels.rms_norm(x, w, EPS).float(), rms_norm(x, w, EPS).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_adds_in_place_then_normalises(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 64, generator=g).to(dtype)
    delta = torch.randn(5, 64, generator=g).to(dtype)
    w = torch.randn(64, generator=g).to(dtype)
    want_x = x + delta  # the add rounds to the dtype, as torch's does
    out = cpu_kernels.add_rms_norm(x, delta, w, EPS)
    assert torch.equal(x, want_x)
    torch.testing.assert_close(out.float(), rms_norm(want_x, w, EPS).float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_rope_store_matches_torch(dtype: torch.dtype, tol: float) -> None:
    T, H, Hkv, D, slots_n = 37, 9, 3, 64, 200
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=g).to(dtype)
    angle = torch.rand(T, D, generator=g) * 6
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    slots = torch.randperm(slots_n, generator=g)[:T]
    k_cache, v_cache = torch.zeros(slots_n, Hkv, D, dtype=dtype), torch.zeros(slots_n, Hkv, D, dtype=dtype)
    q = cpu_kernels.rope_store(qkv, cos, sin, k_cache, v_cache, slots, H, Hkv)
    qk = qkv[:, : (H + Hkv) * D].view(T, H + Hkv, D)
    want = qk * cos[:, None] + rotate_half(qk) * sin[:, None]
    torch.testing.assert_close(q.float(), want[:, :H].float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k_cache[slots].float(), want[:, H:].float(), atol=tol, rtol=tol)
    assert torch.equal(v_cache[slots], qkv[:, (H + Hkv) * D :].view(T, Hkv, D))
    untouched = torch.ones(slots_n, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()
    with pytest.raises(RuntimeError, match="outside the pool"):
        cpu_kernels.rope_store(qkv, cos, sin, k_cache, v_cache, slots + slots_n, H, Hkv)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_rope_store_norms_q_and_k_heads_first(dtype: torch.dtype, tol: float) -> None:
    """Qwen3's per-head q/k RMSNorms inside the op equal llama.py's torch path (norm, then RoPE)."""
    T, H, Hkv, D, slots_n = 21, 16, 8, 128, 64
    g = torch.Generator().manual_seed(3)
    qkv = (torch.randn(T, (H + 2 * Hkv) * D, generator=g) * 4).to(dtype)
    angle = torch.rand(T, D, generator=g) * 6
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    q_norm, k_norm = (torch.rand(D, generator=g) + 0.5).to(dtype), (torch.rand(D, generator=g) + 0.5).to(dtype)
    slots = torch.randperm(slots_n, generator=g)[:T]
    k_cache, v_cache = torch.zeros(slots_n, Hkv, D, dtype=dtype), torch.zeros(slots_n, Hkv, D, dtype=dtype)
    q = cpu_kernels.rope_store(qkv, cos, sin, k_cache, v_cache, slots, H, Hkv, q_norm, k_norm, EPS)
    qk = qkv[:, : (H + Hkv) * D].view(T, H + Hkv, D)
    qk = torch.cat([rms_norm(qk[:, :H], q_norm, EPS), rms_norm(qk[:, H:], k_norm, EPS)], dim=1)
    want = qk * cos[:, None] + rotate_half(qk) * sin[:, None]
    torch.testing.assert_close(q.float(), want[:, :H].float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k_cache[slots].float(), want[:, H:].float(), atol=tol, rtol=tol)
    assert torch.equal(v_cache[slots], qkv[:, (H + Hkv) * D :].view(T, Hkv, D))
    with pytest.raises(RuntimeError, match="both or neither"):
        cpu_kernels.rope_store(qkv, cos, sin, k_cache, v_cache, slots, H, Hkv, q_norm, None, EPS)
    with pytest.raises(RuntimeError, match="q_norm, k_norm"):
        cpu_kernels.rope_store(qkv, cos, sin, k_cache, v_cache, slots, H, Hkv, q_norm[:64], k_norm, EPS)


def test_bad_shapes_raise() -> None:
    with pytest.raises(RuntimeError, match="weight"):
        cpu_kernels.rms_norm(torch.zeros(2, 8), torch.zeros(9), EPS)
    with pytest.raises(RuntimeError, match="delta"):
        cpu_kernels.add_rms_norm(torch.zeros(2, 8), torch.zeros(3, 8), torch.zeros(8), EPS)
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_kernels.rms_norm(torch.zeros(2, 8), torch.zeros(8, dtype=torch.bfloat16), EPS)


def test_used_only_where_the_model_is_not_bound_to_transformers(tiny_model_dir: Path) -> None:
    exact = LLM(str(tiny_model_dir), dtype="float32", max_total_tokens=1024)
    fused = LLM(str(tiny_model_dir), dtype="bfloat16", max_total_tokens=1024)
    off = LLM(str(tiny_model_dir), dtype="bfloat16", max_total_tokens=1024, fused_ops="off")
    assert (exact.engine.model.fused_ops, fused.engine.model.fused_ops, off.engine.model.fused_ops) == (False, True, False)
    assert fused.engine.model.fused_silu == cpu_kernels.silu_mul_simd() and not off.engine.model.fused_silu
    ns = [llm.engine.prefix_cache.root for llm in (exact, fused, off)]  # type: ignore[union-attr]
    assert len({repr(n) for n in ns}) == 3  # K/V of fused and torch norms never share pages
    prompt = list(range(5, 90))
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    a, b = fused.generate([prompt], greedy)[0], off.generate([prompt], greedy)[0]
    # bf16 rounding of a different summation order may flip a near-tie late; most tokens agree
    same = sum(x == y for x, y in zip(a.token_ids, b.token_ids))
    assert a.token_ids[:4] == b.token_ids[:4] and same >= 8, (a.token_ids, b.token_ids)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 8, 300])
def test_silu_mul_matches_torch(dtype: torch.dtype, tol: float, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * 1536, generator=g) * 4).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, -30.0, 30.0, 0.0])  # saturated both sides, and zero
    gate, up = gate_up.chunk(2, dim=-1)
    want = (torch.nn.functional.silu(gate.float()) * up.float())
    out = cpu_kernels.silu_mul(gate_up)
    assert out.dtype == dtype and out.shape == (rows, 1536)
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    with pytest.raises(RuntimeError, match="gate_up"):
        cpu_kernels.silu_mul(torch.zeros(3, 5, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_vector_lanes_and_tail_give_the_same_bits(dtype: torch.dtype) -> None:
    """An intermediate size the vector loop does not divide (1,539: a tail of 3 after 8- or 16-lane
    steps): each value comes out the same whether a vector lane or the scalar tail computed it."""
    g = torch.Generator().manual_seed(7)
    gate, up = (torch.randn(2, 1539, generator=g) * 6).to(dtype), torch.randn(2, 1539, generator=g).to(dtype)
    shifted = lambda t: torch.roll(t, 5, dims=1)  # the last values move into the vector part
    out = cpu_kernels.silu_mul(torch.cat([gate, up], dim=1))
    moved = cpu_kernels.silu_mul(torch.cat([shifted(gate), shifted(up)], dim=1))
    assert torch.equal(shifted(out), moved)
