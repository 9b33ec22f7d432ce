"""A tiny random Qwen3-MoE end to end, in float32: through the engine its greedy tokens are transformers'
(prompt by prompt and as one batch) from the Hugging Face folder and from the same weights as llama.cpp
writes them in a GGUF; a model with dense layers among its MoE ones gives transformers' logits; with its
experts in Q8_0 a decode step runs them on the integer-dot kernels over views of the loaded tiles."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from moe_support import save_folder, write_gguf

from kvstrata.engine.llm import LLM
from kvstrata.engine.sampling_params import SamplingParams
from kvstrata.kv.pool import PagePool
from kvstrata.model import cpu_kernels
from kvstrata.model.attention import AttentionMetadata, PrefillSeq, make_attention_backend
from kvstrata.model.layer_weights import DenseMlp
from kvstrata.model.llama import LlamaModel
from kvstrata.model.moe import MoeBlock
from kvstrata.model.weights import load_weights

CPU = torch.device("cpu")
NEW_TOKENS = 12
PROMPTS = [torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 11, 17, 30)]


@pytest.fixture(scope="module")
def folder_and_model(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("tiny-qwen3moe")
    return out, save_folder(out, smollm2_path)


@pytest.fixture(scope="module")
def hf_greedy(folder_and_model: tuple[Path, Any]) -> list[list[int]]:
    model = folder_and_model[1]
    with torch.inference_mode():
        return [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=2)[0, len(p):]
                .tolist() for p in PROMPTS]


def _source(kind: str, folder: Path, tokenizer: Path, tmp_path: Path) -> Path:
    if kind == "folder":
        return folder
    write_gguf(tmp_path / "tiny-qwen3moe.gguf", folder, tokenizer)
    return tmp_path / "tiny-qwen3moe.gguf"


@pytest.mark.parametrize("kind", ["folder", "gguf"])
def test_engine_greedy_tokens_are_transformers(kind: str, folder_and_model: tuple[Path, Any], smollm2_path: Path,
                                               hf_greedy: list[list[int]], tmp_path: Path) -> None:
    path = _source(kind, folder_and_model[0], smollm2_path, tmp_path)
    llm = LLM(str(path), dtype="float32", max_total_tokens=2048)
    model = llm.engine.model
    assert model.arch.architecture == "qwen3moe" and model.exact and model.decode_layers is None
    assert all(isinstance(layer.mlp, MoeBlock) for layer in model.layers)
    greedy = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
    assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == hf_greedy  # one batch: decode rows share experts
    llm.engine.flush_cache()
    assert [llm.generate([p], greedy)[0].token_ids for p in PROMPTS] == hf_greedy
    llm.engine.check_integrity()
    assert all(len(set(t)) > 1 for t in hf_greedy)  # replies that move, not one token repeated


def test_the_gguf_holds_the_folders_weights(folder_and_model: tuple[Path, Any], smollm2_path: Path,
                                            tmp_path: Path) -> None:
    folder = load_weights(folder_and_model[0])
    gguf = load_weights(_source("gguf", folder_and_model[0], smollm2_path, tmp_path))
    assert list(gguf.tensors) == list(folder.tensors)
    assert all(torch.equal(gguf.tensors[n], t) for n, t in folder.tensors.items())
    assert folder.tensors["model.layers.1.mlp.experts.down_proj.weight"].shape == (8, 64, 32)
    assert gguf.arch.dense_layers == folder.arch.dense_layers == () and gguf.arch.norm_topk_prob


def test_a_folder_missing_an_expert_is_refused(folder_and_model: tuple[Path, Any], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src = folder_and_model[0]
    state = load_file(str(src / "model.safetensors"))
    del state["model.layers.1.mlp.experts.3.down_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(ValueError, match="1 tensors missing.*layers.1.mlp.experts.down_proj"):
        load_weights(tmp_path)


def _steps(model: LlamaModel, ids: torch.Tensor, n: int) -> list[torch.Tensor]:
    """A prefill of ids[:n] on scattered pages, then one decode step a token: each step's logits."""
    a, ps, pages = model.arch, 4, [5, 2, 9, 0, 7, 11, 3, 14]
    pool = PagePool(16, ps, a.num_layers, a.num_kv_heads, a.head_dim, model.dtype)
    slots = torch.tensor([pages[p // ps] * ps + p % ps for p in range(len(ids))])
    meta = AttentionMetadata(ps, slots[:n], [PrefillSeq(0, n, n, torch.tensor(pages[:-(-n // ps)]))])
    out = [model.forward(ids[:n], torch.arange(n), meta, pool.k, pool.v, torch.arange(n))]
    for pos in range(n, len(ids)):
        npages = pos // ps + 1
        meta = AttentionMetadata(ps, slots[pos:pos + 1], [], decode_rows=torch.tensor([0]),
                                 decode_pages=torch.tensor([pages[:npages]]),
                                 decode_mask=(torch.arange(npages * ps) <= pos)[None, None, None, :], decode_lens=[pos + 1])
        out.append(model.forward(ids[pos:pos + 1], torch.tensor([pos]), meta, pool.k, pool.v, torch.tensor([0])))
    return out


@pytest.mark.parametrize("overrides", [{"mlp_only_layers": [0]}, {"decoder_sparse_step": 2}])
def test_dense_layers_among_moe_ones_give_transformers_logits(overrides: dict[str, Any], smollm2_path: Path,
                                                             tmp_path: Path) -> None:
    ref = save_folder(tmp_path, smollm2_path, num_hidden_layers=3, **overrides)
    w = load_weights(tmp_path)
    model = LlamaModel(w.arch, w.tensors, torch.float32, CPU, make_attention_backend("torch_sdpa"))
    dense = [0] if "mlp_only_layers" in overrides else [0, 2]
    assert [i for i, layer in enumerate(model.layers) if isinstance(layer.mlp, DenseMlp)] == list(w.arch.dense_layers) == dense
    ids = torch.tensor(PROMPTS[2])
    with torch.inference_mode():
        want = ref(ids[None]).logits[0]  # [17, V]
    got = _steps(model, ids, 13)
    torch.testing.assert_close(got[0], want[:13], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(got[1:]), want[13:], atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory: pytest.TempPathFactory, folder_and_model: tuple[Path, Any], smollm2_path: Path) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3moe-q8") / "tiny-qwen3moe-q8.gguf"
    write_gguf(path, folder_and_model[0], smollm2_path, expert_type="Q8_0")
    return path


@pytest.mark.parametrize("fused_ops", [False, True])
def test_q8_0_experts_run_on_views_of_their_tiles(q8_gguf: Path, fused_ops: bool) -> None:
    """Q8_0 experts: the dense load (each expert dequantized) is the float reference. Loaded for the
    integer-dot kernels without dense copies, a decode step runs each chosen expert on its rows of the
    stacked tiles (views: no copy), within the kernels' rounding of the reference; a prefill step
    dequantizes each chosen expert just before its GEMM: the reference's values, so the same logits."""
    assert cpu_kernels.load_kernels()
    dense = load_weights(q8_gguf)
    quant = load_weights(q8_gguf, torch.float32, "int_dot", keep_dense=False)
    assert sorted(quant.tiles) == sorted(n for n in dense.tensors if ".experts." in n) and quant.types[
        "model.layers.0.mlp.experts.up_proj.weight"] == "Q8_0"
    stacked = dict(quant.tiles)
    attn = make_attention_backend("torch_sdpa")
    ref = LlamaModel(dense.arch, dense.tensors, torch.float32, CPU, attn)
    lean = LlamaModel(dense.arch, {n: t for n, t in dense.tensors.items() if n not in stacked}, torch.float32, CPU, attn,
                      tiles=quant.tiles, q4_max_rows=1, fused_ops=fused_ops)
    assert lean.uses_int_dot and not lean.dense_linears and lean.decode_layers is None and not quant.tiles
    block = lean.layers[1].mlp
    assert isinstance(block, MoeBlock)
    tiles = stacked["model.layers.1.mlp.experts.down_proj.weight"]  # [8 * 64 / 16, 32 / 32, bytes]
    for e, expert in enumerate(block.experts):
        assert expert.down.dense is None and expert.down.quant is not None
        part = expert.down.quant.parts[0]
        assert part.data_ptr() == tiles[e * 4].data_ptr() and part.shape[0] == 4 and part.is_contiguous()
    ids = torch.tensor(PROMPTS[3])
    want, got = _steps(ref, ids, 24), _steps(lean, ids, 24)
    if not fused_ops:  # our fused norms round otherwise
        assert torch.equal(got[0], want[0])
    scale = want[0].abs().max().item()
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w, atol=2e-2 * scale, rtol=2e-2)
        assert g.argmax() == w.argmax()
