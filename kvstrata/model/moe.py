"""Mixture-of-experts MLP blocks: the MLP of an MoE layer in place of the dense one (Qwen3-MoE).

A block is a router (which k experts each token runs, and with what weights) and its experts (SwiGLU
MLPs). An expert's gate, up and down are `Linear`s (layer_weights.py) over views of the loaded stacked
tensors [experts, out, in]: the dense tensor's [out, in] slice, and the int-dot tiles' rows of that
expert (whole tiles: gguf_loader.py packs a stacked tensor only where each expert's rows are). No
expert's weights are copied, and a quantized expert runs on the integer-dot kernels for a narrow step,
or is dequantized just before its GEMM in a wide one where the model keeps no dense copy, as any linear.

One forward for prefill and decode steps: the step's (token, slot) pairs are sorted by expert (a stable
argsort: each expert's rows stay in token order); each expert with rows runs once on all of them (its
weights read once a step, rows sharing an expert share the read, experts no row chose never run); its
output, times the routing weight, is added into its tokens' rows with `index_add_`, expert after expert
in ascending order from zeros: transformers' eager `Qwen3MoeExperts` order, so each token's sum is the
same float32 sum.

A new MoE is a new entry of `MOE_BLOCKS` (architecture -> builder) with its own `Router` (gpt-oss: top-k
of the logits, then softmax, with a bias; DeepSeek: sigmoid scores, group-limited top-k) and, where it
has them, `shared` experts (a dense MLP every token runs, added to the routed sum); the forward pass
(llama.py) calls a layer's MLP whatever it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import torch
import torch.nn.functional as F

from kvstrata.model.arch import ModelArch
from kvstrata.model.layer_weights import Linear, Mlp, Scratch
from kvstrata.model.quant.linear import QuantLinear


class Routing(NamedTuple):
    experts: torch.Tensor  # [T, k] long: each token's experts
    weights: torch.Tensor  # [T, k] in the activations' dtype: their weights in its sum


class Router(Protocol):
    top_k: int  # experts a token runs

    def __call__(self, h: torch.Tensor) -> Routing:
        """h [T, hidden] -> each row's experts and weights."""
        ...

    def token_params(self) -> int: ...


@dataclass
class SoftmaxTopK:
    """Qwen3-MoE's router, as transformers' Qwen3MoeTopKRouter computes it: the logits in the activations'
    dtype, their softmax in float32, its top k (`torch.topk` on the probabilities, called as transformers
    calls it, so tied experts resolve as there), renormalised to sum to 1 where `norm`."""

    weight: torch.Tensor  # [experts, hidden]
    top_k: int
    norm: bool

    def __call__(self, h: torch.Tensor) -> Routing:
        logits = F.linear(h, self.weight)  # [T, experts]
        probs = F.softmax(logits, dtype=torch.float32, dim=-1)
        top, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        if self.norm:
            top /= top.sum(dim=-1, keepdim=True)
        return Routing(experts, top.to(logits.dtype))

    def token_params(self) -> int:
        return self.weight.shape[0] * self.weight.shape[1]


@dataclass
class Expert:
    """One SwiGLU expert: down(silu(gate(x)) * up(x))."""

    gate: Linear  # [I, hidden]
    up: Linear  # [I, hidden]
    down: Linear  # [hidden, I]

    def __call__(self, x: torch.Tensor, narrow: bool, scratch: Scratch) -> torch.Tensor:
        act = F.silu(self.gate(x, narrow, scratch)) * self.up(x, narrow, scratch)  # [rows, I]
        return self.down(act, narrow, scratch)

    def linears(self) -> list[Linear]:
        return [self.gate, self.up, self.down]


@dataclass
class MoeBlock:
    """A router, its routed experts and, where the architecture has them, shared experts."""

    router: Router
    experts: list[Expert]
    shared: Mlp | None = None  # every token runs it; its output is added to the routed sum

    def __call__(self, h: torch.Tensor, narrow: bool, scratch: Scratch, fused_silu: bool) -> torch.Tensor:
        """h [T, hidden] -> [T, hidden]: the routed experts' weighted sum (plus the shared experts')."""
        routing = self.router(h)
        k = routing.experts.shape[1]
        flat = routing.experts.reshape(-1)  # [T * k]: pair p is token p // k's slot p % k
        order = torch.argsort(flat, stable=True)  # pairs by expert, each expert's in token order
        weights = routing.weights.reshape(-1)
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(torch.bincount(flat, minlength=len(self.experts)).tolist()):
            if n == 0:
                continue
            pairs = order[start:start + n]
            start += n
            rows = pairs // k  # [n] its tokens, ascending
            y = self.experts[e](h[rows], narrow, scratch)  # [n, hidden]
            out.index_add_(0, rows, y * weights[pairs, None])
        if self.shared is not None:
            out += self.shared(h, narrow, scratch, fused_silu)
        return out

    def linears(self) -> list[Linear]:
        shared = self.shared.linears() if self.shared is not None else []
        return [lin for expert in self.experts for lin in expert.linears()] + shared

    def token_params(self) -> int:
        """The router's, the k experts' a token runs and the shared experts'."""
        k = self.router.top_k
        expert = sum(lin.params for lin in self.experts[0].linears()) if self.experts else 0
        shared = self.shared.token_params() if self.shared is not None else 0
        return self.router.token_params() + k * expert + shared


@dataclass(frozen=True)
class WeightForms:
    """The forms the loader kept of a model's weights, in the model's dtype and on its device."""

    tensors: dict[str, torch.Tensor]  # dense, by HF name (weights.py)
    tiles: dict[str, torch.Tensor]  # int-dot tiles by HF name (quant/int_dot.py); an MoE block takes its own
    dtype: torch.dtype
    device: torch.device

    def dense(self, name: str) -> torch.Tensor | None:
        """The dense tensor (itself, where the loader gave it in this dtype on this device), else None."""
        return self.tensors[name].to(device=self.device, dtype=self.dtype) if name in self.tensors else None

    def expert_linears(self, name: str, num_experts: int) -> list[Linear]:
        """One Linear an expert of the stacked tensor `name` [experts, out, in]: views of its dense form
        and of its tiles, taken out of `tiles` ([experts * out / 16, in / 32, bytes]: an expert's rows
        are whole tiles), never copies."""
        dense = self.dense(name)
        packed = self.tiles.pop(name, None)
        if dense is None and packed is None:
            raise ValueError(f"{name}: missing in every form; the checkpoint is incomplete")
        per = packed.shape[0] // num_experts if packed is not None else 0  # tile rows an expert
        return [Linear(dense[e] if dense is not None else None,
                       QuantLinear(parts=[packed[e * per:(e + 1) * per]]) if packed is not None else None)
                for e in range(num_experts)]


def qwen3moe_block(arch: ModelArch, layer: int, forms: WeightForms) -> MoeBlock:
    """Qwen3-MoE's sparse block: softmax top-k routing over SwiGLU experts, no shared expert."""
    p = f"model.layers.{layer}.mlp."
    weight = forms.dense(p + "gate.weight")
    if weight is None:
        raise ValueError(f"{p}gate.weight: the router is missing; the checkpoint is incomplete")
    gate, up, down = (forms.expert_linears(f"{p}experts.{n}_proj.weight", arch.num_experts)
                      for n in ("gate", "up", "down"))
    experts = [Expert(g, u, d) for g, u, d in zip(gate, up, down)]
    return MoeBlock(SoftmaxTopK(weight.contiguous(), arch.num_experts_per_tok, arch.norm_topk_prob), experts)


# architecture -> the builder of its MoE layers' MLP
MOE_BLOCKS: dict[str, Callable[[ModelArch, int, WeightForms], MoeBlock]] = {"qwen3moe": qwen3moe_block}


def build_moe(arch: ModelArch, layer: int, forms: WeightForms) -> MoeBlock:
    """The MoE block of `layer` (an MoE layer: arch.moe_layer) for this architecture."""
    builder = MOE_BLOCKS.get(arch.architecture)
    if builder is None:
        raise ValueError(f"{arch.architecture} has MoE layers but kvstrata has no MoE block for it; "
                         f"MoE architectures it runs: {sorted(MOE_BLOCKS)}.")
    return builder(arch, layer, forms)
