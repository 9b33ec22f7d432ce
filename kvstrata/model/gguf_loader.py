"""Load a GGUF file's tensors as float32 CPU tensors under Hugging Face Llama names.

Each tensor is dequantized with `gguf.quants.dequantize` (every type that package knows: F32,
F16, BF16, Q4_0/1, Q5_0/1, Q8_0, K-quants, IQ*), reshaped to torch order (GGUF lists dims
innermost first), renamed, and for the `llama` architecture the Q/K rows are un-permuted:
llama.cpp's converter interleaves each head's two RoPE halves (`permute` in
convert_hf_to_gguf.py); Hugging Face keeps them as [first half | second half].
With `keep_q4`, linears stored as Q4_0/Q4_1 also come back as their 4-bit blocks (q4_weights.py),
un-permuted the same way, for the int4 decode path.
"""
from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.gguf_header import GGUFTensorInfo, gguf_identity, read_gguf_header
from kvstrata.model.q4_weights import Q4Weight, read_q4

logger = logging.getLogger(__name__)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {  # GGUF "blk.N.<part>" -> HF "model.layers.N.<part>"
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Kept under its GGUF name: Llama 3.x files store their RoPE frequency factors (divisors of
# inv_freq) as a tensor instead of rope_scaling metadata; HF has no tensor name for it.
ROPE_FREQS = "rope_freqs.weight"


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None when there is none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name == ROPE_FREQS:
        return ROPE_FREQS
    match = _BLOCK_RE.match(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"
    return None


def load_gguf(
    path: Path, num_threads: int | None = None, keep_q4: bool = False
) -> tuple[ModelArch, dict[str, torch.Tensor], str, dict[str, Q4Weight]]:
    """(arch, float32 tensors by HF name, identity, 4-bit linears by HF name if `keep_q4`) of `path`."""
    header = read_gguf_header(path)
    arch = ModelArch.from_gguf_metadata(header.metadata, header.tensor_names())
    wanted: list[tuple[GGUFTensorInfo, str]] = []
    for info in header.tensors:
        name = hf_name(info.name)
        if name is None:
            logger.warning("event=gguf_tensor_skipped name=%s reason=no_hf_name", info.name)
            continue
        if name == "lm_head.weight" and arch.tie_word_embeddings:
            continue
        wanted.append((info, name))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    threads = num_threads or min(8, torch.get_num_threads())
    # numpy releases the GIL in the dequant kernels, so tensors dequantize in parallel.
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(lambda item: _load_tensor(data, item[0], item[1], arch, keep_q4), wanted))
    del data
    tensors = {name: tensor for (_, name), (tensor, _) in zip(wanted, results)}
    q4 = {name: q for (_, name), (_, q) in zip(wanted, results) if q is not None}
    return arch, tensors, gguf_identity(header), q4


def _load_tensor(
    data: np.memmap, info: GGUFTensorInfo, name: str, arch: ModelArch, keep_q4: bool
) -> tuple[torch.Tensor, Q4Weight | None]:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(info.ggml_type)
    raw = data[info.offset:info.offset + info.nbytes]
    rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
    raw = raw.reshape(rows, info.nbytes // rows)  # [rows, bytes per row]
    values = dequantize(raw, qtype)
    if np.may_share_memory(values, raw):  # F32 comes back as a view of the read-only map
        values = values.copy()
    values = values.astype(np.float32, copy=False).reshape(info.shape)
    tensor = torch.from_numpy(values)
    q4 = read_q4(raw, qtype.name, tuple(info.shape)) if keep_q4 and name.endswith("proj.weight") else None
    if arch.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = arch.num_heads if name.endswith("q_proj.weight") else arch.num_kv_heads
        tensor = unpermute_rope_rows(tensor, heads)
        if q4 is not None:
            q4 = q4.rows(unpermute_rope_rows(torch.arange(tensor.shape[0]).unsqueeze(1), heads).squeeze(1))
    return tensor, q4


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation.

    llama.cpp: w.reshape(heads, 2, half, ...).swapaxes(1, 2) -> rows ordered (head, half, 2).
    Inverse:   w.reshape(heads, half, 2, ...).swapaxes(1, 2) -> rows ordered (head, 2, half).
    """
    half = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # [heads, half, 2, in]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()


def permute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's permutation (what its converter applies); the inverse of `unpermute_rope_rows`."""
    half = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, 2, half, *weight.shape[1:])  # [heads, 2, half, in]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()
