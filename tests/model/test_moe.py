"""moe.py's parts on their own: the router picks (ties included) and weighs experts as transformers'
Qwen3MoeTopKRouter does, the block runs each chosen expert once a step on all its rows (and no other),
shared experts add to the routed sum, and the architecture's MoE fields read from either source."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.layer_weights import DenseMlp, Linear, Scratch
from kvstrata.model.moe import Expert, MoeBlock, SoftmaxTopK, WeightForms, build_moe

HIDDEN, EXPERTS, I = 16, 8, 8


def _hf_router(weight: torch.Tensor, top_k: int, norm: bool) -> Any:
    import transformers as tf

    config = tf.Qwen3MoeConfig(hidden_size=weight.shape[1], num_experts=weight.shape[0], num_experts_per_tok=top_k,
                               norm_topk_prob=norm)
    router = tf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter(config)
    with torch.no_grad():
        router.weight.copy_(weight)
    return router.eval()


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_tied_experts_resolve_as_in_transformers(norm: bool, top_k: int) -> None:
    """Integer weights and inputs make the logits exact integers, so the ties are exact: two experts tied
    for the top, three tied across the k-th place, and every expert tied (a zero row)."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randint(-3, 4, (EXPERTS, HIDDEN), generator=g).float()
    weight[5] = weight[2]  # 2 and 5 always tie
    weight[6] = weight[3] = weight[1]  # and 1, 3 and 6
    h = torch.randint(-2, 3, (12, HIDDEN), generator=g).float()
    h[0] = 0  # every logit 0: all eight tied
    ours = SoftmaxTopK(weight, top_k, norm)(h)
    with torch.inference_mode():
        _, want_weights, want_experts = _hf_router(weight, top_k, norm)(h)
    assert torch.equal(ours.experts, want_experts) and torch.equal(ours.weights, want_weights)
    logits = h @ weight.T
    assert torch.equal(logits[:, 2], logits[:, 5]) and torch.equal(logits[:, 1], logits[:, 6])
    ranked = logits.sort(dim=1, descending=True).values
    assert (ranked[1:, top_k - 1] == ranked[1:, top_k]).any()  # beyond the zero row, a tie decided a pick


def _linear(g: torch.Generator, out: int, inp: int) -> Linear:
    return Linear(torch.randn(out, inp, generator=g) * 0.3, None)


def _block(shared: DenseMlp | None = None) -> MoeBlock:
    g = torch.Generator().manual_seed(1)
    experts = [Expert(_linear(g, I, HIDDEN), _linear(g, I, HIDDEN), _linear(g, HIDDEN, I)) for _ in range(EXPERTS)]
    return MoeBlock(SoftmaxTopK(torch.randn(EXPERTS, HIDDEN, generator=g), 2, True), experts, shared)


def _per_token(block: MoeBlock, h: torch.Tensor) -> torch.Tensor:
    """The block's sum one token and one slot at a time (the definition, without grouping)."""
    routing = block.router(h)
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for e, w in zip(routing.experts[t].tolist(), routing.weights[t]):
            out[t] += w * block.experts[e](h[t:t + 1], False, Scratch())[0]
    return out


def _index(block: MoeBlock, expert: Expert) -> int:
    return next(i for i, e in enumerate(block.experts) if e is expert)


def test_each_chosen_expert_runs_once_a_step_on_all_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    block = _block()
    h = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2))
    calls: list[tuple[int, list[int]]] = []
    run = Expert.__call__

    def counted(self: Expert, x: torch.Tensor, narrow: bool, scratch: Scratch) -> torch.Tensor:
        rows = [int(((h - r).abs().sum(1) == 0).nonzero()[0]) for r in x]  # which tokens x holds
        calls.append((_index(block, self), rows))
        return run(self, x, narrow, scratch)

    monkeypatch.setattr(Expert, "__call__", counted)
    out = block(h, False, Scratch(), False)
    chosen = block.router(h).experts
    want = {e: [t for t in range(9) if e in chosen[t].tolist()] for e in sorted(set(chosen.flatten().tolist()))}
    assert calls == list(want.items())  # ascending experts, each once, its tokens in order; no other expert
    assert len(want) >= 3 and any(len(rows) > 1 for rows in want.values())  # several experts, rows sharing one
    monkeypatch.setattr(Expert, "__call__", run)
    torch.testing.assert_close(out, _per_token(block, h), atol=1e-5, rtol=1e-5)


def test_one_decode_row_runs_only_its_k_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    block = _block()
    seen: list[int] = []
    run = Expert.__call__
    monkeypatch.setattr(Expert, "__call__", lambda self, x, n, s: seen.append(_index(block, self)) or run(self, x, n, s))
    h = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(3))
    block(h, False, Scratch(), False)
    assert seen == sorted(block.router(h).experts[0].tolist())


def test_shared_experts_add_to_the_routed_sum() -> None:
    g = torch.Generator().manual_seed(4)
    shared = DenseMlp(_linear(g, 2 * I, HIDDEN), _linear(g, HIDDEN, I))
    h = torch.randn(5, HIDDEN, generator=g)
    routed = _block()(h, False, Scratch(), False)
    both = _block(shared)(h, False, Scratch(), False)
    torch.testing.assert_close(both, routed + shared(h, False, Scratch(), False))
    assert len(_block(shared).linears()) == 3 * EXPERTS + 2


def test_experts_are_views_of_the_stacked_tensors() -> None:
    arch = ModelArch("qwen3moe", 32, HIDDEN, 24, 1, 2, 1, 8, 1e4, 1e-6, 64, False, qk_norm=True, num_experts=EXPERTS,
                     num_experts_per_tok=2, moe_intermediate_size=I, norm_topk_prob=True)
    p = "model.layers.0.mlp."
    tensors = {p + "gate.weight": torch.randn(EXPERTS, HIDDEN),
               **{f"{p}experts.{n}_proj.weight": torch.randn(EXPERTS, *s)
                  for n, s in (("gate", (I, HIDDEN)), ("up", (I, HIDDEN)), ("down", (HIDDEN, I)))}}
    block = build_moe(arch, 0, WeightForms(tensors, {}, torch.float32, torch.device("cpu")))
    down = tensors[p + "experts.down_proj.weight"]
    for e, expert in enumerate(block.experts):
        assert expert.down.dense is not None and expert.down.dense.data_ptr() == down[e].data_ptr()  # no copy
    assert block.token_params() == EXPERTS * HIDDEN + 2 * 3 * I * HIDDEN
    with pytest.raises(ValueError, match="no MoE block for it"):
        build_moe(ModelArch(**{**arch.__dict__, "architecture": "llama"}), 0, WeightForms(tensors, {}, torch.float32,
                                                                                          torch.device("cpu")))


def test_hf_config_dense_layers_as_transformers_picks_them() -> None:
    config = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
              "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
              "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "norm_topk_prob": True,
              "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    arch = ModelArch.from_hf_config(config)
    assert (arch.architecture, arch.qk_norm, arch.num_experts, arch.norm_topk_prob) == ("qwen3moe", True, 4, True)
    assert arch.dense_layers == (0, 2, 3, 4) and [arch.moe_layer(i) for i in range(6)] == [False, True, False, False,
                                                                                           False, True]
    saved = {**config, "num_local_experts": 4, "decoder_sparse_step": 1, "mlp_only_layers": []}
    del saved["num_experts"]  # transformers 5 saves the experts' count under this name
    assert ModelArch.from_hf_config(saved).num_experts == 4 and ModelArch.from_hf_config(saved).dense_layers == ()


@pytest.mark.parametrize("norm", [None, False])
def test_gguf_metadata_renormalises_unless_it_says_not(norm: bool | None) -> None:
    """llama.cpp's qwen3moe always renormalises the top-k (its converter writes no key for it); a file that
    says `expert_weights_norm` false does not."""
    meta: dict[str, Any] = {"general.architecture": "qwen3moe", "tokenizer.ggml.tokens": ["a"] * 32}
    for key, value in {"block_count": 2, "context_length": 64, "embedding_length": 16, "feed_forward_length": 24,
                       "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-6, "expert_count": 4,
                       "expert_used_count": 2, "expert_feed_forward_length": 8}.items():
        meta[f"qwen3moe.{key}"] = value
    if norm is not None:
        meta["qwen3moe.expert_weights_norm"] = norm
    arch = ModelArch.from_gguf_metadata(meta, ["blk.0.attn_q_norm.weight", "output.weight"])
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (4, 2, 8)
    assert arch.norm_topk_prob == (norm is None) and arch.dense_layers == () and arch.qk_norm
