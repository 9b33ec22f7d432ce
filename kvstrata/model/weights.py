"""`load_weights(path)`: a GGUF file or a HF safetensors folder -> float32 tensors under HF names.

Whatever the source, the result holds exactly the tensors `expected_tensor_names(arch)` lists:
    model.embed_tokens.weight                                   [vocab, hidden]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight            q: [heads*head_dim, hidden]
                                                                k/v: [kv_heads*head_dim, hidden]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias                qwen2 only
    model.layers.{i}.self_attn.{q,k}_norm.weight                qwen3 only, [head_dim]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight
    model.layers.{i}.{input,post_attention}_layernorm.weight    [hidden]
    model.norm.weight                                           [hidden]
    lm_head.weight                                              only when not tied
plus `rope_freqs.weight` when a Llama 3.x GGUF carries RoPE frequency factors.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.gguf_loader import ROPE_FREQS, load_gguf
from kvstrata.model.q4_weights import Q4Weight
from kvstrata.model.safetensors_loader import load_folder

logger = logging.getLogger(__name__)


@dataclass
class LoadedWeights:
    arch: ModelArch
    tensors: dict[str, torch.Tensor]  # float32, CPU, HF names
    identity: str  # short stable id of these weights; namespaces cache keys
    source_path: Path
    q4: dict[str, Q4Weight] = field(default_factory=dict)  # GGUF Q4_0/Q4_1 linears, when asked for


def expected_tensor_names(arch: ModelArch) -> list[str]:
    """Every tensor name the forward pass reads for `arch`, in load order."""
    names = ["model.embed_tokens.weight"]
    for i in range(arch.num_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        names += [f"{attn}.{p}_proj.weight" for p in ("q", "k", "v", "o")]
        if arch.attention_bias:
            names += [f"{attn}.{p}_proj.bias" for p in ("q", "k", "v")]
        if arch.qk_norm:
            names += [f"{attn}.q_norm.weight", f"{attn}.k_norm.weight"]
        names += [f"{mlp}.{p}_proj.weight" for p in ("gate", "up", "down")]
        names += [f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not arch.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def load_weights(path: str | Path, keep_q4: bool = False) -> LoadedWeights:
    """Load a .gguf file or a folder with config.json + *.safetensors as float32 CPU tensors.

    `keep_q4`: also keep a GGUF's Q4_0/Q4_1 linears as 4-bit blocks (`LoadedWeights.q4`).
    """
    q4: dict[str, Q4Weight] = {}
    path = Path(path).expanduser()
    start = time.perf_counter()
    if path.is_dir():
        arch, tensors, identity = load_folder(path, expected_tensor_names)
    elif path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is neither a .gguf file nor a folder; pass a GGUF file or a HF model folder.")
        arch, tensors, identity, q4 = load_gguf(path, keep_q4=keep_q4)
    else:
        raise FileNotFoundError(f"model path {path} does not exist; pass a .gguf file or a HF model folder.")
    tensors = _select(path, arch, tensors)
    logger.info(
        "event=weights_loaded path=%s arch=%s tensors=%d identity=%s seconds=%.2f",
        path, arch.architecture, len(tensors), identity, time.perf_counter() - start,
    )
    return LoadedWeights(arch=arch, tensors=tensors, identity=identity, source_path=path, q4=q4)


def _select(path: Path, arch: ModelArch, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` in `expected_tensor_names` order (plus rope_freqs); raises if any is missing."""
    expected = expected_tensor_names(arch)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise ValueError(
            f"{path}: {len(missing)} tensors missing for a {arch.architecture} model "
            f"(first: {missing[:3]}); the checkpoint is incomplete or of another architecture."
        )
    selected = {name: tensors[name] for name in expected}
    if ROPE_FREQS in tensors:
        selected[ROPE_FREQS] = tensors[ROPE_FREQS]
    extra = sorted(set(tensors) - set(selected))
    if extra:
        logger.info("event=weights_extra_dropped count=%d first=%s", len(extra), extra[0])
    return selected
