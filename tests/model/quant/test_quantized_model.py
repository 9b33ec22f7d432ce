"""A model on quantized linears: the real GGUF's blocks hold its dense weights, narrow steps on our
integer-dot tiles or torch's int4 kernel give the dense model's logits, a model without dense copies
(wide steps dequantize each linear) gives the same logits as one with them, and the default path
uses our kernels exactly where the CPU has them."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from quant_support import quantize_linears

from kvstrata.kv.pool import PagePool
from kvstrata.model import cpu_kernels
from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend
from kvstrata.model.llama import LlamaModel
from kvstrata.model.quant import int_dot
from kvstrata.model.weights import load_weights

CPU = torch.device("cpu")


def test_real_gguf_tiles_hold_its_dense_weights(smollm2_path: Path) -> None:
    assert cpu_kernels.load_kernels()
    w = load_weights(smollm2_path, torch.float32, "int_dot", keep_dense=True)
    assert len(w.tiles) == 7 * w.arch.num_layers  # every linear of SmolLM2 is Q4_1
    assert set(w.rows) == {"model.embed_tokens.weight"} and w.types["model.embed_tokens.weight"] == "Q8_0"
    dense = load_weights(smollm2_path)  # the dense load the exact path uses
    assert not dense.tiles and not dense.rows
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.7.self_attn.k_proj.weight",
                 "model.layers.29.mlp.down_proj.weight"):
        assert torch.equal(int_dot.dequantize(w.tiles[name], torch.float32), dense.tensors[name]), name  # q/k: row order undone too
        assert torch.equal(w.tensors[name], dense.tensors[name])
    ids = torch.tensor([0, 7, 49151, 7])
    embed = dense.tensors["model.embed_tokens.weight"]
    assert torch.equal(w.rows["model.embed_tokens.weight"](ids), embed[ids])
    lean = load_weights(smollm2_path, torch.bfloat16, "int_dot", keep_dense=False)  # no dense copies at all
    assert not any(n.endswith("proj.weight") for n in lean.tensors) and "model.embed_tokens.weight" not in lean.tensors
    assert lean.tensors["model.norm.weight"].dtype == torch.bfloat16


def _two_steps(model: LlamaModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An 8-row prefill (wider than q4_max_rows) then one decode row: both steps' logits."""
    a = model.arch
    ps, pages, n = 4, [3, 1, 6], 8
    slots = torch.tensor([pages[p // ps] * ps + p % ps for p in range(9)])
    pool = PagePool(8, ps, a.num_layers, a.num_kv_heads, a.head_dim, model.dtype)
    meta = AttentionMetadata(ps, slots[:n], [PrefillSeq(0, n, n, torch.tensor(pages[:2]))])
    prefill = model.forward(ids[:n], torch.arange(n), meta, pool.k, pool.v, torch.arange(n))
    meta = AttentionMetadata(ps, slots[n:], [], decode_rows=torch.tensor([0]), decode_pages=torch.tensor([pages]),
                             decode_mask=(torch.arange(3 * ps) <= n)[None, None, None, :], decode_lens=[n + 1])
    return prefill, model.forward(ids[n:], torch.tensor([n]), meta, pool.k, pool.v, torch.tensor([0]))


@pytest.mark.parametrize("kernel", ["int_dot", "torch_int4"])
def test_decode_steps_on_quantized_linears_match_dense_logits(tiny_model_dir: Path, kernel: str) -> None:
    """The dense weights are the quantized values: decode rows through the kernel == dense, up to the
    kernel's activation rounding (16-bit integers for ours, bf16 for torch's) and the int8 head's
    (exact for each row's top candidates)."""
    assert cpu_kernels.load_kernels()
    w = load_weights(tiny_model_dir)
    kinds = {"int_dot": lambda n: "Q8_0" if "v_proj" in n else "Q5_0" if "down" in n else "Q4_1",
             "torch_int4": lambda n: "Q4_1" if "up" in n else "Q4_0"}[kernel]
    tiles, blocks, dense_w = quantize_linears(w.tensors, kinds)
    attn = make_attention_backend("torch_sdpa")
    dense = LlamaModel(w.arch, dense_w, torch.float32, CPU, attn)
    quant = {"tiles": tiles} if kernel == "int_dot" else {"q4": blocks}
    model = LlamaModel(w.arch, dense_w, torch.float32, CPU, attn, q4_max_rows=1, fused_ops=False, **quant)
    assert model.uses_quant and not dense.uses_quant and model.uses_int_dot == (kernel == "int_dot")
    if kernel == "int_dot":
        assert [lin.quant.formats() for lin in model.layers[0].linears()] == [["q4", "q4", "q8s"], ["q4"], ["q4", "q4"], ["q5s"]]
    ids = torch.randint(0, w.arch.vocab_size, (9,), generator=torch.Generator().manual_seed(0))
    (dp, dd), (qp, qd) = _two_steps(dense, ids), _two_steps(model, ids)
    assert torch.equal(dp, qp)  # the wide step did not touch the quantized weights
    torch.testing.assert_close(qd, dd, atol=2e-2 * dd.abs().max().item(), rtol=2e-2)
    top = dd.topk(8, dim=-1).indices
    torch.testing.assert_close(qd.gather(1, top), dd.gather(1, top), atol=2e-3 * dd.abs().max().item(), rtol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_without_dense_copies_gives_the_same_logits(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    """Wide steps dequantize each linear into a scratch buffer just before its GEMM; the values are the
    dense copies' (Q4/Q5/Q8_0 tiles hold the file's own scales), so both models agree exactly."""
    assert cpu_kernels.load_kernels()
    w = load_weights(tiny_model_dir)
    tiles, _, dense_w = quantize_linears(w.tensors, lambda n: "Q8_0" if "k_proj" in n else "Q4_0")
    attn = make_attention_backend("torch_sdpa")
    both = LlamaModel(w.arch, dense_w, dtype, CPU, attn, tiles=dict(tiles), fused_ops=False)  # it takes its tiles
    lean_tensors = {n: t for n, t in dense_w.items() if n not in tiles}
    lean = LlamaModel(w.arch, lean_tensors, dtype, CPU, attn, tiles=tiles, fused_ops=False)
    assert both.dense_linears and not lean.dense_linears
    assert all(lin.dense is None for lin in lean.layers[1].linears())
    ids = torch.randint(0, w.arch.vocab_size, (9,), generator=torch.Generator().manual_seed(1))
    for a, b in zip(_two_steps(both, ids), _two_steps(lean, ids)):
        assert torch.equal(a, b)


def test_our_kernels_are_used_exactly_where_the_cpu_has_them() -> None:
    from kvstrata.engine.llm import LLM

    model = LLM("smollm2", max_total_tokens=512).engine.model
    layer = model.layers[0].quant
    assert layer is not None and model.uses_int_dot == cpu_kernels.int_dot_simd()
    assert (layer.gate_up.torch_int4 is None) == model.uses_int_dot
    off = LLM("smollm2", max_total_tokens=512, fused_ops="off").engine.model
    assert not off.uses_int_dot and off.layers[0].quant is not None and off.layers[0].quant.qkv.torch_int4 is not None


def test_q4_decode_on_needs_quantized_weights(tiny_model_dir: Path) -> None:
    from kvstrata import LLM
    from kvstrata.config_flags import ConfigError

    with pytest.raises(ConfigError, match="no quantized linears"):
        LLM(str(tiny_model_dir), q4_decode="on", max_total_tokens=64)


def test_a_prompt_longer_than_a_step_on_a_model_without_dense_copies() -> None:
    """The first chunks of a long prompt want no logits: the head (int8, exact rows from the file) gets
    zero rows and must give zero rows of logits (the file-row reader failed on an empty read: a 500 for
    every prompt longer than a step on models over --prefill-weights auto's limit of dense bytes)."""
    from kvstrata import LLM, SamplingParams

    lean = LLM("smollm2", prefill_weights="dequant", max_num_batched_tokens=32, max_total_tokens=512)
    assert lean.engine.model.head.dense is None and lean.engine.model.head.rows is not None
    prompt = "Write down every number from one to forty, separated by commas: one, two, three,"
    params = SamplingParams(max_tokens=8, temperature=0)
    ids = lean.engine.tokenizer.encode(prompt * 3)
    assert len(ids) > 32  # a step of prefill with no logits before the one with them
    out = lean.generate([prompt * 3], params)[0]
    assert len(out.token_ids) == 8
    # the same greedy tokens as the dense prefill, or (where bf16 puts the first token on a near-tie: it
    # did on a 2-core Xeon of family 6 model 167, 9517 against 19161) as the float32 reference
    dense = LLM("smollm2", prefill_weights="dense", max_num_batched_tokens=32, max_total_tokens=512)
    exact = LLM("smollm2", dtype="float32", max_num_batched_tokens=32, max_total_tokens=512)
    assert out.token_ids in [m.generate([prompt * 3], params)[0].token_ids for m in (dense, exact)]


def test_wide_steps_on_the_integer_kernels(tiny_model_dir: Path) -> None:
    """--prefill-weights int: a wide step's linears run on the tiles as a narrow step's do, rows apart, so
    the 8-row prefill writes the K/V an all-narrow model writes (the next decode step's logits are equal)."""
    assert cpu_kernels.load_kernels()
    w = load_weights(tiny_model_dir)
    tiles, _, dense_w = quantize_linears(w.tensors, lambda n: "Q5_1" if "down" in n else "Q4_1")
    attn = make_attention_backend("torch_sdpa")
    wide = LlamaModel(w.arch, dense_w, torch.float32, CPU, attn, tiles=dict(tiles), q4_max_rows=1, fused_ops=False,
                      act_bits=8, int_prefill=True)
    narrow = LlamaModel(w.arch, dense_w, torch.float32, CPU, attn, tiles=dict(tiles), q4_max_rows=8, fused_ops=False,
                        act_bits=8)
    plain = LlamaModel(w.arch, dense_w, torch.float32, CPU, attn, tiles=tiles, q4_max_rows=1, fused_ops=False, act_bits=8)
    assert wide.int_prefill and not narrow.int_prefill and wide.act_bits == 8
    ids = torch.randint(0, w.arch.vocab_size, (9,), generator=torch.Generator().manual_seed(2))
    (wp, wd), (np_, nd), (pp, pd) = _two_steps(wide, ids), _two_steps(narrow, ids), _two_steps(plain, ids)
    assert torch.equal(wd, nd)
    assert not torch.equal(wd, pd)  # the dense prefill's K/V differ: the step did run on the tiles
    torch.testing.assert_close(wp, pp, atol=5e-2 * pp.abs().max().item(), rtol=5e-2)


def test_8_bit_activations_keep_cache_on_equal_to_cache_off() -> None:
    """SmolLM2 with --activation-bits 8 (prefill on the integer kernels too): a prompt served from the
    prefix cache gives the tokens its uncached prefill gives; the KV namespace is its own."""
    from kvstrata import LLM, SamplingParams

    params = SamplingParams(max_tokens=12, temperature=0)
    system = "You are a terse assistant. Answer in one sentence. " * 4
    prompts = [system + q for q in ("What is a tide?", "What is a glacier?")]
    runs, roots = [], []
    for bits, caching in (("8", True), ("8", False), ("16", True)):
        llm = LLM("smollm2", activation_bits=bits, enable_prefix_caching=caching, max_total_tokens=1024, speculative="off")
        m = llm.engine.model
        if caching:
            roots.append(llm.engine.prefix_cache.root)
        if bits == "16":
            break
        assert m.act_bits == 8 and m.int_prefill and (m.decode_layers is None or m.decode_layers.act_bits == 8)
        outs = llm.generate(prompts, params) if not caching else [llm.generate([p], params)[0] for p in prompts]
        assert not caching or outs[1].cached_tokens > 0
        runs.append([o.token_ids for o in outs])
    assert runs[0] == runs[1]
    assert roots[0] != roots[1]  # 8-bit K/V never serve a 16-bit model (L3 is shared across machines)
