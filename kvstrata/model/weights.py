"""`load_weights(path)`: a GGUF file or a HF safetensors folder -> tensors under HF names.

Whatever the source, the result holds exactly the tensors `expected_tensor_names(arch)` lists (dense,
or for a GGUF loaded for the quantized kernels some as tiles, blocks or file rows; gguf_loader.py):
    model.embed_tokens.weight                                   [vocab, hidden]
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight            q: [heads*head_dim, hidden]
                                                                k/v: [kv_heads*head_dim, hidden]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias                qwen2 only
    model.layers.{i}.self_attn.{q,k}_norm.weight                qwen3 only, [head_dim]
    model.layers.{i}.mlp.{gate,up,down}_proj.weight            a dense-MLP layer
    model.layers.{i}.mlp.gate.weight                            an MoE layer (moe.py): the router [experts, hidden]
    model.layers.{i}.mlp.experts.{gate,up,down}_proj.weight     its experts stacked: gate/up [experts, I, hidden],
                                                                down [experts, hidden, I]
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
from kvstrata.model.quant.blocks import IntWeight
from kvstrata.model.quant.gguf_rows import GgufRows
from kvstrata.model.safetensors_loader import load_folder

logger = logging.getLogger(__name__)


@dataclass
class LoadedWeights:
    arch: ModelArch
    tensors: dict[str, torch.Tensor]  # dense, CPU, HF names
    identity: str  # short stable id of these weights; namespaces cache keys
    source_path: Path
    tiles: dict[str, torch.Tensor] = field(default_factory=dict)  # GGUF linears as int-dot tiles, when asked for
    q4: dict[str, IntWeight] = field(default_factory=dict)  # GGUF Q4_0/Q4_1 linears for torch's int4 kernel
    rows: dict[str, GgufRows] = field(default_factory=dict)  # GGUF embedding / LM head read from the file
    types: dict[str, str] = field(default_factory=dict)  # GGUF type name by HF name


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
        if arch.moe_layer(i):
            names += [f"{mlp}.gate.weight", *(f"{mlp}.experts.{p}_proj.weight" for p in ("gate", "up", "down"))]
        else:
            names += [f"{mlp}.{p}_proj.weight" for p in ("gate", "up", "down")]
        names += [f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not arch.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def load_weights(path: str | Path, dtype: torch.dtype = torch.float32, quant: str | None = None,
                 keep_dense: bool = True, cache_root: Path | None = None) -> LoadedWeights:
    """Load a .gguf file or a folder with config.json + *.safetensors, dense tensors in `dtype`.

    `quant` and `keep_dense` (GGUF only; gguf_loader.load_gguf): "int_dot" keeps block-type linears as
    int-dot tiles and the embedding / LM head in the file (dense copies too only with `keep_dense`);
    "torch_int4" keeps the Q4_0/Q4_1 linears' blocks beside the dense weights. `cache_root`: where a GGUF's
    converted tiles and int8 head are kept between starts (quant/converted_cache.py; None: converted each time).
    """
    path = Path(path).expanduser()
    start = time.perf_counter()
    if path.is_dir():
        arch, tensors, identity = load_folder(path, expected_tensor_names)
        loaded = LoadedWeights(arch, {n: t.to(dtype) for n, t in tensors.items()}, identity, path)
    elif path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"{path} is neither a .gguf file nor a folder; pass a GGUF file or a HF model folder.")
        g = load_gguf(path, dtype, quant, keep_dense, cache_root=cache_root)
        loaded = LoadedWeights(g.arch, g.tensors, g.identity, path, g.tiles, g.q4, g.rows, g.types)
    else:
        raise FileNotFoundError(f"model path {path} does not exist; pass a .gguf file or a HF model folder.")
    _check(loaded)
    logger.info(
        "event=weights_loaded path=%s arch=%s tensors=%d identity=%s seconds=%.2f",
        path, loaded.arch.architecture, len(expected_tensor_names(loaded.arch)), loaded.identity,
        time.perf_counter() - start,
    )
    return loaded


def _check(w: LoadedWeights) -> None:
    """Drops tensors the model does not read; raises if any it reads is missing in every form."""
    expected = expected_tensor_names(w.arch)
    have = set(w.tensors) | set(w.tiles) | set(w.q4) | set(w.rows)
    missing = [name for name in expected if name not in have]
    if missing:
        raise ValueError(
            f"{w.source_path}: {len(missing)} tensors missing for a {w.arch.architecture} model "
            f"(first: {missing[:3]}); the checkpoint is incomplete or of another architecture."
        )
    keep = set(expected) | {ROPE_FREQS}
    extra = sorted(set(w.tensors) - keep)
    if extra:
        logger.info("event=weights_extra_dropped count=%d first=%s", len(extra), extra[0])
    w.tensors = {name: w.tensors[name] for name in [*expected, ROPE_FREQS] if name in w.tensors}
