"""The C++ bf16 prefill attention kernel (kvstrata/model/csrc/paged_prefill.cpp) against the torch
path it replaces (page gather + SDPA), over random scattered page tables: whole prompts and chunks
over a cached prefix, each head size and GQA group; a query's result does not depend on the chunk
it is computed in; the backend falls back to SDPA where the kernel does not apply.

On a CPU without AVX512-BF16 the op runs its portable code (the same tiles and rounding), so every
test runs on every CPU; the engine only picks it where the CPU has the instructions."""
from __future__ import annotations

import pytest
import torch

from kvstrata.model import cpu_kernels
from kvstrata.model.attention import AttentionMetadata, CpuPagedBackend, PrefillSeq, TorchSDPABackend
from kvstrata.model.cpu_caps import read_cpu_info

PS = 16
NATIVE = "avx512_bf16" in read_cpu_info().flags  # where the engine uses the kernel


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"


def case(n: int, kv_len: int, heads: int = 9, kv_heads: int = 3, dim: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    need = -(-kv_len // PS)
    num_pages = need + 7
    k = torch.randn(num_pages * PS, kv_heads, dim, generator=g).bfloat16()
    v = torch.randn(num_pages * PS, kv_heads, dim, generator=g).bfloat16()
    pages = torch.randperm(num_pages, generator=g)[:need]  # scattered over the pool
    q = torch.randn(n, heads, dim, generator=g).bfloat16()
    return q, k, v, pages


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pages: torch.Tensor, kv_len: int) -> torch.Tensor:
    return TorchSDPABackend._prefill(q, k, v, PrefillSeq(0, q.shape[0], kv_len, pages), PS)


def test_the_kernel_is_there_exactly_where_the_cpu_has_avx512_bf16() -> None:
    q, k, _, _ = case(4, 4)
    assert cpu_kernels.paged_prefill_supports(q, k) == NATIVE
    assert not cpu_kernels.paged_prefill_supports(q.float(), k.float())  # float32 stays on SDPA
    assert not cpu_kernels.paged_prefill_supports(torch.zeros(2, 9, 80).bfloat16(), torch.zeros(4, 3, 80).bfloat16())


@pytest.mark.parametrize("n,kv_len,heads,kv_heads,dim", [
    (1, 1, 9, 3, 64), (5, 5, 9, 3, 64), (100, 100, 9, 3, 64), (2048, 2048, 9, 3, 64),  # whole prompts
    (37, 300, 9, 3, 64), (1, 977, 9, 3, 64), (64, 1000, 4, 4, 128),  # chunks over a cached prefix
    (33, 33, 16, 1, 16), (70, 90, 8, 2, 32), (20, 40, 2, 1, 256),
    (96, 300, 32, 8, 64), (64, 200, 32, 4, 128),  # Llama 3.2 1B (GQA 4:1), an 8:1 model at head dim 128
])
def test_matches_sdpa_on_the_same_pages(n: int, kv_len: int, heads: int, kv_heads: int, dim: int) -> None:
    q, k, v, pages = case(n, kv_len, heads, kv_heads, dim, seed=n + kv_len)
    out = cpu_kernels.paged_prefill(q, k, v, pages, kv_len, PS)
    exact = sdpa(q.float(), k.float(), v.float(), pages, kv_len)  # float32 from the same bf16 inputs
    plain = sdpa(q, k, v, pages, kv_len)  # what the engine ran before: torch's bf16 flash kernel
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    err, plain_err = (out.float() - exact).abs().max().item(), (plain.float() - exact).abs().max().item()
    # bf16 rounding of P and of the output, as in torch's kernel: no worse than the path it replaces
    assert err <= 1.25 * plain_err + 2e-3, (err, plain_err)


def test_a_query_gives_the_same_bits_in_any_chunk() -> None:
    """Prefix cache on == off: a prompt prefilled whole, or as chunks over pages already written,
    gives every query the same output, bit for bit."""
    q, k, v, pages = case(300, 300, seed=5)
    whole = cpu_kernels.paged_prefill(q, k, v, pages, 300, PS)
    for cuts in ([137], [1, 64, 65, 200], [16, 32, 299]):
        parts, start = [], 0
        for end in [*cuts, 300]:
            parts.append(cpu_kernels.paged_prefill(q[start:end], k, v, pages, end, PS))
            start = end
        assert torch.equal(torch.cat(parts), whole), cuts


def test_bad_inputs_raise_instead_of_reading_out_of_bounds() -> None:
    q, k, v, pages = case(8, 40)
    with pytest.raises(RuntimeError, match="kv_len"):
        cpu_kernels.paged_prefill(q, k, v, pages, pages.shape[0] * PS + 1, PS)
    with pytest.raises(RuntimeError, match="kv_len"):
        cpu_kernels.paged_prefill(q, k, v, pages, 7, PS)  # fewer tokens than queries
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.kvstrata.paged_prefill(q.float(), k, v, pages, 40, PS)
    with pytest.raises(RuntimeError, match="int64"):
        cpu_kernels.paged_prefill(q, k, v, pages.int(), 40, PS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backend_uses_the_kernel_where_it_applies_and_sdpa_elsewhere(dtype: torch.dtype) -> None:
    """A step of two prefill chunks and one decode row through CpuPagedBackend: each chunk as the decode
    kernel's one-row steps (bf16 on AMX-BF16), the prefill kernel (bf16 elsewhere with AVX512-BF16) or
    SDPA (float32, or a CPU without the kernel) computes it alone."""
    q1, k, v, pages = case(50, 121, seed=7)  # pages for 121 tokens: the first 4 hold the first chunk
    q2 = case(20, 120, seed=8)[0]
    qd = case(1, 1, seed=9)[0]
    q = torch.cat([q1, q2, qd]).to(dtype)
    k, v = k.to(dtype), v.to(dtype)
    tail = pages[:8]
    meta = AttentionMetadata(page_size=PS, slot_mapping=torch.zeros(71, dtype=torch.long),
                             prefill=[PrefillSeq(0, 50, 50, pages[:4]), PrefillSeq(50, 20, 120, tail)],
                             decode_rows=torch.tensor([70]), decode_pages=tail[None, :], decode_lens=[121],
                             decode_lens_t=torch.tensor([121]),
                             decode_mask=(torch.arange(8 * PS) < 121)[None, None, None, :])
    out = CpuPagedBackend().forward(q, k, v, meta)
    if dtype == torch.bfloat16 and NATIVE and cpu_kernels.amx_bf16_attention():
        # on AMX-BF16 a chunk is the decode kernel's row group: each row's bits are its one-row step's
        def steps(q_rows: torch.Tensor, table: torch.Tensor, first_len: int) -> torch.Tensor:
            return torch.cat([cpu_kernels.paged_decode(q_rows[i:i + 1], k, v, table[None, :],
                                                       torch.tensor([first_len + i]), PS) for i in range(len(q_rows))])

        want1, want2 = steps(q[:50], pages[:4], 1), steps(q[50:70], tail, 101)
    elif dtype == torch.bfloat16 and NATIVE:
        want1 = cpu_kernels.paged_prefill(q[:50], k, v, pages[:4], 50, PS)
        want2 = cpu_kernels.paged_prefill(q[50:70], k, v, tail, 120, PS)
    else:
        want1, want2 = sdpa(q[:50], k, v, pages[:4], 50), sdpa(q[50:70], k, v, tail, 120)
    assert torch.equal(out[:50], want1) and torch.equal(out[50:70], want2)
    want_d = cpu_kernels.paged_decode(q[70:], k, v, tail[None, :], torch.tensor([121]), PS)
    assert torch.equal(out[70:], want_d)


def test_page_ids_outside_the_pool_raise() -> None:
    q, k, v, pages = case(4, 40)
    num_pages = k.shape[0] // PS
    for bad in (num_pages, -1):
        wrong = pages.clone()
        wrong[-1] = bad
        with pytest.raises(RuntimeError, match="outside the pool"):
            cpu_kernels.paged_prefill(q, k, v, wrong, 40, PS)
    longer = torch.cat([pages, torch.tensor([1 << 40])])  # a page past kv_len is never read
    torch.testing.assert_close(cpu_kernels.paged_prefill(q, k, v, longer, 40, PS), cpu_kernels.paged_prefill(q, k, v, pages, 40, PS))


@pytest.mark.parametrize("n,kv_len", [(255, 255), (256, 256), (300, 1300), (2048, 2048)])
def test_long_bf16_chunks_take_torchs_flash_kernel_on_amx(n: int, kv_len: int) -> None:
    """On AMX-BF16 a chunk of SPLIT_PREFIX_MIN_QUERIES (256) queries or more runs as TorchSDPABackend (flash, split
    at the prefix): the same bits; a shorter one stays the decode kernel's row group; elsewhere nothing changes."""
    q, k, v, pages = case(n, kv_len, seed=n)
    seq = PrefillSeq(0, n, kv_len, pages)
    out = CpuPagedBackend._prefill(q, k, v, seq, PS)
    flash = torch.equal(out, sdpa(q, k, v, pages, kv_len))
    if NATIVE and cpu_kernels.amx_bf16_attention():
        assert flash == (n >= 256)
    assert torch.allclose(out.float(), sdpa(q, k, v, pages, kv_len).float(), atol=2e-2, rtol=2e-2)
