"""All layers of a pure decode step in one op (kvstrata/model/decode_layers.py, csrc/decode_layers.cpp):
the same bits as the Python loop over the same kernels (logits and every K/V row it writes), only
where each of its ops applies, and off with --fused-decode-layers off."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from quant_support import quantize_linears, random_raw

from kvstrata.kv.pool import PagePool
from kvstrata.model import cpu_kernels
from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend
from kvstrata.model.llama import LlamaModel
from kvstrata.model.quant import int_dot
from kvstrata.model.quant.blocks import decode_blocks
from kvstrata.model.weights import load_weights

CPU = torch.device("cpu")
PS = 4
pytestmark = pytest.mark.skipif(not cpu_kernels.int_dot_simd(), reason="the one-op decode runs the integer-dot "
                                "kernels' vector forms only: this CPU has neither AVX512-VNNI nor AVX2+FMA+F16C")


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    assert cpu_kernels.load_kernels(), "the C++ kernels did not build (see the log)"
    if not cpu_kernels.int_dot_simd():
        pytest.fail("this CPU has neither AVX512-VNNI nor AVX2: the int4 kernel (and this op) never run here")


MIXED = lambda name: "Q8_0" if "v_proj" in name else "Q5_1" if "down" in name else "Q4_1"  # noqa: E731


def _q4_model(tiny_model_dir: Path, dtype: torch.dtype, bias: bool, kinds: object = lambda name: "Q4_1",
              **kw: object) -> LlamaModel:
    """The tiny model with its linears quantized (Q4_1, or `kinds` by name; dense copies = the same
    values), on our integer-dot tiles, cpu_paged."""
    w = load_weights(tiny_model_dir)
    tiles, _, tensors = quantize_linears(w.tensors, kinds)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(5)
    if bias:  # Qwen2's qkv biases
        for name, t in list(tensors.items()):
            if name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"):
                tensors[name.replace(".weight", ".bias")] = torch.randn(t.shape[0], generator=g) * 0.1
    return LlamaModel(w.arch, tensors, dtype, CPU, make_attention_backend("cpu_paged"), tiles=tiles, **kw)


def _decode_meta(slots: list[int], pages: list[list[int]], lens: list[int]) -> AttentionMetadata:
    width = max(len(p) for p in pages)
    table = torch.tensor([p + [0] * (width - len(p)) for p in pages])
    mask = (torch.arange(width * PS)[None, :] < torch.tensor(lens)[:, None])[:, None, None, :]
    return AttentionMetadata(PS, torch.tensor(slots), [], decode_rows=torch.arange(len(lens)), decode_pages=table,
                             decode_mask=mask, decode_lens=lens, decode_lens_t=torch.tensor(lens))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias,mixed", [(False, False), (True, False), (False, True)])
def test_one_op_gives_the_python_loops_bits(tiny_model_dir: Path, dtype: torch.dtype, bias: bool, mixed: bool) -> None:
    """`mixed`: v in another block type than q and k, o and gate/up Q4_1, down Q5_1."""
    model = _q4_model(tiny_model_dir, dtype, bias, MIXED if mixed else lambda name: "Q4_1")
    op = model.decode_layers
    assert op is not None and model.uses_int_dot
    parts = [p.shape[2] for p in model.layers[0].qkv.quant.parts]
    assert parts == ([320, 320, 544] if mixed else [320] * 3)  # v: Q8_0, symmetric (q8s)
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
    assert _q4_model(tiny_model_dir, torch.bfloat16, False, fused_ops=False).decode_layers is None  # no fused ops
    w = load_weights(tiny_model_dir)
    dense = LlamaModel(w.arch, w.tensors, torch.bfloat16, CPU, make_attention_backend("cpu_paged"))
    assert dense.decode_layers is None  # no quantized weights
    mixed = _decode_meta([1], [[0]], [2])
    mixed.prefill = [PrefillSeq(1, 3, 3, torch.tensor([1]))]  # a prefill chunk in the step: the Python loop
    assert not _q4_model(tiny_model_dir, torch.bfloat16, False).decode_layers.applies(mixed, 4)


def _real_shape_model(hidden: int, heads: int, kv_heads: int, dtype: torch.dtype) -> LlamaModel:
    """Two layers of a real model's width and GQA (vocabulary cut to 512), K-quant tiles only (as a
    Q4_K_M file: Q6_K for v and down), no dense copies: prefill dequantizes, decode runs the tiles."""
    from kvstrata.model.arch import ModelArch

    ffn = 2 * hidden
    arch = ModelArch("llama", 512, hidden, ffn, 2, heads, kv_heads, hidden // heads, 500000.0, 1e-5, 4096, True)
    kv = kv_heads * arch.head_dim
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden),
              "mlp.down_proj": (hidden, ffn)}
    tiles, tensors = {}, {}
    for i in range(2):
        for part, (n, k) in shapes.items():
            kind = "Q6_K" if part in ("self_attn.v_proj", "mlp.down_proj") else "Q4_K"
            tiles[f"model.layers.{i}.{part}.weight"] = int_dot.pack(decode_blocks(random_raw(kind, n, k, i, 2e-4), kind, (n, k)))
        tensors[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(hidden)
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(hidden)
    tensors["model.norm.weight"] = torch.ones(hidden)
    tensors["model.embed_tokens.weight"] = torch.randn(512, hidden, generator=torch.Generator().manual_seed(0))
    return LlamaModel(arch, tensors, dtype, CPU, make_attention_backend("cpu_paged"), tiles=tiles)


@pytest.mark.parametrize("hidden,heads,kv_heads", [(2048, 32, 8), (4096, 32, 4)])  # Llama 3.2 1B (4:1); 8:1, head dim 128
def test_one_op_at_real_widths_and_gqa(hidden: int, heads: int, kv_heads: int) -> None:
    model = _real_shape_model(hidden, heads, kv_heads, torch.float32)
    op = model.decode_layers
    assert op is not None and not model.dense_linears
    assert [p.shape[2] for p in model.layers[0].qkv.quant.parts] == [296, 296, 448]  # q, k: Q4_K (q4k); v: Q6_K, symmetric (q6s)
    a = model.arch
    pool = PagePool(16, PS, a.num_layers, a.num_kv_heads, a.head_dim, torch.float32)
    pages, n = [[3, 1, 6, 9, 2]], 13
    slot = lambda p: pages[0][p // PS] * PS + p % PS  # noqa: E731
    ids = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(2))
    prefill = AttentionMetadata(PS, torch.tensor([slot(p) for p in range(n)]), [PrefillSeq(0, n, n, torch.tensor(pages[0][:4]))])
    model.forward(ids, torch.arange(n), prefill, pool.k, pool.v, torch.tensor([n - 1]))  # a wide step: dequantized
    meta = _decode_meta([slot(n)], pages, [n + 1])
    got = {}
    for mode in ("op", "loop"):
        k, v = [t.clone() for t in pool.k], [t.clone() for t in pool.v]
        model.decode_layers = op if mode == "op" else None
        got[mode] = (model.forward(torch.tensor([7]), torch.tensor([n]), meta, k, v, torch.tensor([0])), k, v)
    assert torch.isfinite(got["op"][0]).all()
    assert torch.equal(got["op"][0], got["loop"][0])
    assert all(torch.equal(x, y) for x, y in zip(got["op"][1] + got["op"][2], got["loop"][1] + got["loop"][2]))
