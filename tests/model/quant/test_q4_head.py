"""The 4-bit candidate LM head (kvstrata/model/quant/q4_head.py): blocks as llama.cpp's Q4_0 quantizes them,
logits as its dequantized weights give them (8-bit activations), exact where rescored with greedy the exact
head's argmax, built in chunks as at once; the model's head takes it where asked and the kernels run, rescores
more candidates in steps that sample, and a run of SmolLM2 with it gives the int8 head's greedy output."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kvstrata.model import cpu_kernels
from kvstrata.model.embed_head import Head
from kvstrata.model.quant import q4_head
from kvstrata.model.quant.int8_head import Int8Head
from kvstrata.model.quant.q4_head import WIDE_RESCORE, Q4Head, q4_blocks

assert cpu_kernels.load_kernels()


def test_blocks_are_llama_cpps_q4_0() -> None:
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * torch.rand(64, 1) * 0.1
    w[3, :32] = 0  # a block of zeros: scale 0
    want = dequantize(quantize(w.numpy(), GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0).reshape(64, 256)
    assert np.array_equal(q4_blocks(w).dequantize().numpy(), want)


def test_logits_are_its_blocks_and_rescored_ones_exact() -> None:
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(16 * 250, 128, generator=g)
    head = Q4Head.from_rows(lambda a, b: dense[a:b], *dense.shape)
    x = torch.randn(40, 128, generator=g)
    approx = head.approx_logits(x)
    blocks = x @ q4_blocks(dense).dequantize().T  # what the blocks say (activations in 8 bits aside)
    assert approx.dtype == torch.float32 and (approx - blocks).abs().max() < 0.02 * blocks.abs().max()
    want = x @ dense.T
    got = head.logits(x, dense, rescore=16)
    top = approx.topk(16, dim=-1).indices
    assert torch.allclose(got.gather(1, top), want.gather(1, top), rtol=1e-5, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert not torch.equal(approx.argmax(-1), want.argmax(-1))  # which the 4-bit logits alone miss
    assert torch.equal(head.logits(x, lambda ids: dense[ids], rescore=16), got)


def test_built_from_row_chunks_equals_built_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    dense = torch.randn(16 * 40, 64, generator=torch.Generator().manual_seed(2))
    whole = Q4Head.from_rows(lambda a, b: dense[a:b], 16 * 40, 64)
    monkeypatch.setattr(q4_head, "CHUNK_ROWS", 48)
    chunked = Q4Head.from_rows(lambda a, b: dense[a:b], 16 * 40, 64)
    assert torch.equal(chunked.tiles, whole.tiles) and chunked.nbytes == 16 * 40 * 64 * 9 // 16  # 4.5 bits a weight


def test_the_model_head_takes_it_where_asked_and_rescores_more_when_sampling() -> None:
    g = torch.Generator().manual_seed(3)
    dense = torch.randn(16 * 300, 64, generator=g)
    four = Head(dense, None, quantized=True, int_dot=True, dtype=torch.float32, head_bits=4)
    assert isinstance(four.quant, Q4Head) and four.bits == 4
    assert isinstance(Head(dense, None, True, True, torch.float32).quant, Int8Head)  # 8 by default
    assert Head(dense, None, True, False, torch.float32, head_bits=4).bits == 8  # without our kernels: int8
    assert Head(dense, None, False, True, torch.float32, head_bits=4).bits is None  # dense linears: dense head
    x = torch.randn(2, 64, generator=g)
    want = x @ dense.T
    for wide, rescored in ((False, 32), (True, WIDE_RESCORE)):
        got = four(x, narrow=True, wide_rescore=wide)
        exact = torch.isclose(got, want, rtol=1e-5, atol=1e-4).sum(-1)
        assert (exact >= rescored).all() and (exact < rescored + 50).all(), (wide, exact)
    assert torch.equal(four(x, narrow=False), x @ dense.T)  # wide steps: the dense head where there is one


def test_smollm2_greedy_with_the_4_bit_head_is_the_int8_heads(smollm2_path: Path) -> None:
    """The real model end to end: the same greedy tokens (rescoring keeps the exact argmax), and a sampled
    request's steps rescore WIDE_RESCORE candidates."""
    from kvstrata import LLM, SamplingParams

    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 2683, 549, 253, 1345, 30, 378, 314, 2722], [1, 4586, 3458, 28]]
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    runs = {}
    for bits in ("8", "4"):
        llm = LLM(str(smollm2_path), head_bits=bits, max_total_tokens=512, speculative="off")
        assert llm.engine.model.head.bits == int(bits)
        runs[bits] = [o.token_ids for o in llm.generate(prompts, greedy)]
    assert runs["4"] == runs["8"]
    seen: list[bool] = []
    head = llm.engine.model.head
    llm.engine.model.head = lambda x, narrow, wide=False: (seen.append(wide), head(x, narrow, wide))[1]
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.8, seed=1))
    llm.generate(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0))
    assert seen == [True, True, False, False]
