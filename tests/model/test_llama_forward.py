"""The paged forward equals transformers' on tiny random Llama, Qwen2 (q/k/v biases) and Qwen3
(q/k norms) checkpoints, in float32, for a prompt and for decode steps through the page table."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstrata.kv.pool import PagePool
from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend
from kvstrata.model.cpu_caps import parse_cpuinfo
from kvstrata.model.llama import LlamaModel
from kvstrata.model.weights import load_weights

FLAGS = parse_cpuinfo(Path("/proc/cpuinfo").read_text())[1]
# where oneDNN's bf16 weight reorder runs (it refuses other CPUs, e.g. AVX2-only ones)
BF16_REORDER = {"avx512bw", "avx512vl", "avx512dq"} <= FLAGS or "avx_ne_convert" in FLAGS

COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def _save(kind: str, out: Path) -> Any:
    import transformers as tf

    torch.manual_seed(0)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, rope_theta=10000.0))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, tie_word_embeddings=False))
    elif kind == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True))
    else:  # Qwen3 past its native context: YaRN (its attention factor scales every score)
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}))
    for p in model.parameters():  # random biases/norms too, so a missing one would show
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(out)
    return model.eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "qwen3-yarn"])
def test_forward_matches_transformers(kind: str, tmp_path: Path) -> None:
    ref = _save(kind, tmp_path)
    w = load_weights(tmp_path)
    a = w.arch
    ours = LlamaModel(a, w.tensors, torch.float32, torch.device("cpu"), make_attention_backend("torch_sdpa"))
    ps = 4
    pool = PagePool(16, ps, a.num_layers, a.num_kv_heads, a.head_dim, torch.float32)
    pages = [5, 2, 9, 0, 7, 11]  # a scattered page table
    ids = torch.randint(0, 512, (13,))
    with torch.inference_mode():
        want = ref(ids[None]).logits[0]  # [13, V]

    def slots(lo: int, hi: int) -> torch.Tensor:
        return torch.tensor([pages[p // ps] * ps + p % ps for p in range(lo, hi)])

    n = 10  # prefill 10 tokens as one chunk, then decode 3 one at a time
    meta = AttentionMetadata(ps, slots(0, n), [PrefillSeq(0, n, n, torch.tensor(pages[:3]))])
    got = ours.forward(ids[:n], torch.arange(n), meta, pool.k, pool.v, torch.arange(n))
    torch.testing.assert_close(got, want[:n], atol=1e-4, rtol=1e-4)
    for pos in range(n, 13):
        npages = pos // ps + 1
        meta = AttentionMetadata(
            ps, slots(pos, pos + 1), [], decode_rows=torch.tensor([0]),
            decode_pages=torch.tensor([pages[:npages]]),
            decode_mask=(torch.arange(npages * ps) <= pos)[None, None, None, :], decode_lens=[pos + 1],
        )
        got = ours.forward(ids[pos : pos + 1], torch.tensor([pos]), meta, pool.k, pool.v, torch.tensor([0]))
        torch.testing.assert_close(got[0], want[pos], atol=1e-4, rtol=1e-4)


def test_only_bf16_cpu_models_with_fused_ops_prepack(tmp_path: Path) -> None:
    _save("qwen2", tmp_path)
    w = load_weights(tmp_path)
    cpu, attn = torch.device("cpu"), make_attention_backend("torch_sdpa")
    fused = LlamaModel(w.arch, dict(w.tensors), torch.bfloat16, cpu, attn)
    off = LlamaModel(w.arch, dict(w.tensors), torch.bfloat16, cpu, attn, fused_ops=False)
    exact = LlamaModel(w.arch, dict(w.tensors), torch.float32, cpu, attn)
    assert (fused.prepacked, off.prepacked, exact.prepacked) == (BF16_REORDER, False, False)
    assert fused.layers[0].qkv.dense.is_mkldnn == BF16_REORDER and not off.layers[0].qkv.dense.is_mkldnn
    ps, n = 4, 10
    ids = torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(3))
    logits = []
    for model in (fused, off):
        pool = PagePool(8, ps, w.arch.num_layers, w.arch.num_kv_heads, w.arch.head_dim, torch.bfloat16)
        meta = AttentionMetadata(ps, torch.arange(n), [PrefillSeq(0, n, n, torch.arange(3))])
        logits.append(model.forward(ids, torch.arange(n), meta, pool.k, pool.v, torch.arange(n)))
    torch.testing.assert_close(logits[0], logits[1], atol=0.1, rtol=0.05)  # fused norms round differently


def test_a_cpu_where_onednn_refuses_bf16_keeps_plain_weights(tmp_path: Path) -> None:
    """--dtype bfloat16 on an AVX2 CPU: oneDNN's reorder raises there, and the model load died of it.
    ONEDNN_MAX_CPU_ISA=AVX2 makes oneDNN refuse it here too (in a fresh process: it is read once)."""
    _save("llama", tmp_path)
    code = (
        "import sys, torch\n"
        "from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend\n"
        "from kvstrata.kv.pool import PagePool\n"
        "from kvstrata.model.llama import LlamaModel\n"
        "from kvstrata.model.weights import load_weights\n"
        "w = load_weights(sys.argv[1])\n"
        "m = LlamaModel(w.arch, dict(w.tensors), torch.bfloat16, torch.device('cpu'), make_attention_backend('torch_sdpa'))\n"
        "pool = PagePool(8, 4, w.arch.num_layers, w.arch.num_kv_heads, w.arch.head_dim, torch.bfloat16)\n"
        "meta = AttentionMetadata(4, torch.arange(6), [PrefillSeq(0, 6, 6, torch.arange(2))])\n"
        "out = m.forward(torch.arange(6), torch.arange(6), meta, pool.k, pool.v, torch.arange(6))\n"
        "print(m.prepacked, m.fused_ops, bool(torch.isfinite(out).all()))\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["False", "True", "True"]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("lens", [(40,), (23, 17)])
def test_a_wide_integer_step_in_row_chunks_gives_the_bits_of_one_pass(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, fused: bool, lens: tuple[int, ...]) -> None:
    """A wide step on the integer-dot kernels runs q/k/v, the o projection and the MLP in row chunks
    (peak RSS), and one prompt alone its attention too: every logit and every K/V slot it writes are the
    bits of the whole step in one pass, for one prompt or two, with our fused ops or torch's."""
    from quant_support import quantize_linears

    from kvstrata.model import cpu_kernels, row_chunks

    assert cpu_kernels.load_kernels()
    w = load_weights(tiny_model_dir)
    a = w.arch
    tiles, _, dense_w = quantize_linears(w.tensors, lambda n: "Q8_0" if "v_proj" in n else "Q4_1")
    model = LlamaModel(a, dense_w, torch.float32, torch.device("cpu"), make_attention_backend("torch_sdpa"),
                       tiles=tiles, q4_max_rows=1, fused_ops=fused, act_bits=8, int_prefill=True)
    ps, T = 4, sum(lens)
    ids = torch.randint(0, a.vocab_size, (T,), generator=torch.Generator().manual_seed(3))
    calls: list[int] = []
    qkv_rope = model._qkv_rope

    def counted(h: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(h.shape[0])
        return qkv_rope(h, *args)

    monkeypatch.setattr(model, "_qkv_rope", counted)
    attended: list[int] = []
    attend = model.attention.forward

    def counted_attention(q: torch.Tensor, *args: Any) -> torch.Tensor:
        attended.append(q.shape[0])
        return attend(q, *args)

    monkeypatch.setattr(model.attention, "forward", counted_attention)

    def run() -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        pool = PagePool(32, ps, a.num_layers, a.num_kv_heads, a.head_dim, torch.float32)
        seqs, positions, start, page = [], [], 0, 1
        for n in lens:  # each prompt on its own pages, from page 1
            npages = -(-n // ps)
            seqs.append(PrefillSeq(start, n, n, torch.arange(page, page + npages)))
            positions.append(torch.arange(n))
            start, page = start + n, page + npages
        slots = torch.cat([s.pages.repeat_interleave(ps)[:s.q_len] * ps + torch.arange(s.q_len) % ps for s in seqs])
        meta = AttentionMetadata(ps, slots, seqs)
        logits = model.forward(ids, torch.cat(positions), meta, pool.k, pool.v, torch.arange(T))
        return logits, pool.k, pool.v

    monkeypatch.setattr(row_chunks, "CHUNK_BYTES", 0)
    monkeypatch.setattr(row_chunks, "CHUNK_MIN_ROWS", 16)
    chunked = run()
    assert calls == [16, 16, T - 32] * a.num_layers  # the last chunk shorter
    # one prompt alone: attention in the same chunks (each over the context up to its last row); two: all rows
    assert attended == ([16, 16, T - 32] if len(lens) == 1 else [T]) * a.num_layers
    calls.clear()
    attended.clear()
    monkeypatch.setattr(row_chunks, "CHUNK_MIN_ROWS", 1 << 20)
    whole = run()
    assert calls == [T] * a.num_layers and attended == [T] * a.num_layers
    assert torch.equal(chunked[0], whole[0])
    for got, want in zip(chunked[1] + chunked[2], whole[1] + whole[2]):
        assert torch.equal(got, want)
