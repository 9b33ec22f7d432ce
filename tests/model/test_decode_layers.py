"""All layers of a pure decode step in one op (kvstrata/model/decode_layers.py, csrc/decode_layers.cpp):
the same bits as the Python loop over the same kernels (logits and every K/V row it writes), only
where each of its ops applies, and off with --fused-decode-layers off."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvstrata.kv.pool import PagePool
from kvstrata.model import cpu_kernels
from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend
from kvstrata.model.llama import LlamaModel
from kvstrata.model.q4_weights import Q4Weight, read_q4
from kvstrata.model.weights import load_weights

CPU = torch.device("cpu")
PS = 4
pytestmark = pytest.mark.skipif(not cpu_kernels.int_dot_simd(), reason="the one-op decode runs the int4 kernel's vector "
                                "forms only: this CPU has neither AVX512-VNNI nor AVX2+FMA+F16C (or is not x86)")


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"
    if not cpu_kernels.int_dot_simd():
        pytest.fail("this CPU has neither AVX512-VNNI nor AVX2: the int4 kernel (and this op) never run here")


def _q4_model(tiny_model_dir: Path, dtype: torch.dtype, bias: bool, **kw: object) -> LlamaModel:
    """The tiny model with its linears as GGUF Q4_1 (dense copies = the same values), cpu_paged."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = load_weights(tiny_model_dir)
    q4: dict[str, Q4Weight] = {}
    g = torch.Generator().manual_seed(5)
    for name, t in list(w.tensors.items()):
        if name.endswith("proj.weight"):
            raw = quantize(t.float().numpy(), GGMLQuantizationType.Q4_1)
            found = read_q4(raw, "Q4_1", tuple(t.shape))
            assert found is not None
            q4[name] = found
            w.tensors[name] = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_1).astype(np.float32))
            if bias and name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"):  # Qwen2's qkv biases
                w.tensors[name.replace(".weight", ".bias")] = torch.randn(t.shape[0], generator=g) * 0.1
    return LlamaModel(w.arch, w.tensors, dtype, CPU, make_attention_backend("cpu_paged"), q4=q4, **kw)


def _decode_meta(slots: list[int], pages: list[list[int]], lens: list[int]) -> AttentionMetadata:
    width = max(len(p) for p in pages)
    table = torch.tensor([p + [0] * (width - len(p)) for p in pages])
    mask = (torch.arange(width * PS)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    return AttentionMetadata(PS, torch.tensor(slots), [], decode_rows=torch.arange(len(lens)), decode_pages=table,
                             decode_mask=mask, decode_lens=lens, decode_lens_t=torch.tensor(lens))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_one_op_gives_the_python_loops_bits(tiny_model_dir: Path, dtype: torch.dtype, bias: bool) -> None:
    model = _q4_model(tiny_model_dir, dtype, bias)
    op = model.decode_layers
    assert op is not None and model.uses_vnni
    a = model.arch
    pool = PagePool(16, PS, a.num_layers, a.num_kv_heads, a.head_dim, dtype)
    pages = [[3, 1, 6, 9], [2, 7, 11, 4]]  # two sequences, pages out of order
    lens = [10, 13]  # prompts, then decode rows grow them
    slot = lambda s, p: pages[s][p // PS] * PS + p % PS  # noqa: E731
    ids = torch.randint(0, a.vocab_size, (sum(lens),), generator=torch.Generator().manual_seed(1))
    prefill = AttentionMetadata(PS, torch.tensor([slot(s, p) for s in (0, 1) for p in range(lens[s])]),
                                [PrefillSeq(0, lens[0], lens[0], torch.tensor(pages[0][:3])),
                                 PrefillSeq(lens[0], lens[1], lens[1], torch.tensor(pages[1][:4]))])
    assert not op.applies(prefill, len(ids))
    positions = torch.cat([torch.arange(n) for n in lens])
    model.forward(ids, positions, prefill, pool.k, pool.v, torch.tensor([lens[0] - 1, sum(lens) - 1]))
    tokens = torch.tensor([5, 9])
    for _ in range(3):
        meta = _decode_meta([slot(0, lens[0]), slot(1, lens[1])], pages, [lens[0] + 1, lens[1] + 1])
        assert op.applies(meta, 2)
        got = {}
        for mode in ("op", "loop"):
            k, v = [t.clone() for t in pool.k], [t.clone() for t in pool.v]
            model.decode_layers = op if mode == "op" else None
            got[mode] = (model.forward(tokens, torch.tensor(lens), meta, k, v, torch.arange(2)), k, v)
        (lo, ko, vo), (ll, kl, vl) = got["op"], got["loop"]
        assert torch.equal(lo, ll)
        assert all(torch.equal(x, y) for x, y in zip(ko + vo, kl + vl))
        assert not all(torch.equal(x, y) for x, y in zip(ko, pool.k))  # it wrote this step's K rows
        pool.k[:], pool.v[:] = ko, vo
        tokens = lo.argmax(-1)
        lens = [n + 1 for n in lens]


def test_only_where_every_piece_of_it_applies(tiny_model_dir: Path) -> None:
    assert _q4_model(tiny_model_dir, torch.bfloat16, False, fused_decode_layers=False).decode_layers is None
    assert _q4_model(tiny_model_dir, torch.bfloat16, False, fused_ops=False).decode_layers is None  # torch's int4 kernel
    w = load_weights(tiny_model_dir)
    dense = LlamaModel(w.arch, w.tensors, torch.bfloat16, CPU, make_attention_backend("cpu_paged"))
    assert dense.decode_layers is None  # no int4 weights
    mixed = _decode_meta([1], [[0]], [2])
    mixed.prefill = [PrefillSeq(1, 3, 3, torch.tensor([1]))]  # a prefill chunk in the step: the Python loop
    assert not _q4_model(tiny_model_dir, torch.bfloat16, False).decode_layers.applies(mixed, 4)
