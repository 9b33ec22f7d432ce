"""Load a GGUF file's tensors under Hugging Face Llama names, dense or in their quantized blocks.

A dense tensor is dequantized with `gguf.quants.dequantize` (every type that package knows: F32,
F16, BF16, Q4_0/1, Q5_0/1, Q8_0, K-quants, IQ*) straight into the model's dtype, chunk by chunk,
reshaped to torch order (GGUF lists dims innermost first) and renamed. A linear of a block type our
integer-dot kernels run (quant/blocks.py) can instead stay in its blocks, repacked (quant/int_dot.py),
and the embedding and LM head can stay in the mapped file (quant/gguf_rows.py), so loading holds about
the file's size; an MoE layer's stacked experts ([experts, out, in]) pack as one tensor of experts x out
rows, each expert's rows whole tiles (moe.py runs a view an expert). For the `llama` architecture the
Q/K rows are un-permuted: llama.cpp's converter interleaves each head's two RoPE halves (`permute` in
convert_hf_to_gguf.py); Hugging Face keeps them as [first half | second half].
"""
from __future__ import annotations

import functools
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.gguf_header import GGUFTensorInfo, gguf_identity, read_gguf_header
from kvstrata.model.quant.blocks import IntWeight, block_type, decode_blocks
from kvstrata.model.quant.converted_cache import ConvertedCache
from kvstrata.model.quant.gguf_rows import GgufRows, drop_pages
from kvstrata.model.quant.int_dot import pack_raw, raw_packable
from kvstrata.model.quant.torch_int4 import TorchInt4

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
    "ffn_gate_inp": "mlp.gate",  # an MoE layer's router (moe.py)
    "ffn_gate_exps": "mlp.experts.gate_proj",  # its experts, stacked [experts, out, in]
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Kept under its GGUF name: Llama 3.x files store their RoPE frequency factors (divisors of
# inv_freq) as a tensor instead of rope_scaling metadata; HF has no tensor name for it.
ROPE_FREQS = "rope_freqs.weight"
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


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


@dataclass
class GgufWeights:
    arch: ModelArch
    tensors: dict[str, torch.Tensor]  # dense, in the dtype asked for, by HF name
    identity: str
    path: Path
    tiles: dict[str, torch.Tensor] = field(default_factory=dict)  # linears as int-dot tiles (quant/int_dot.py)
    q4: dict[str, IntWeight] = field(default_factory=dict)  # Q4_0/Q4_1 linears for torch's int4 kernel
    rows: dict[str, GgufRows] = field(default_factory=dict)  # embedding / LM head rows read from the file
    types: dict[str, str] = field(default_factory=dict)  # HF name -> the GGUF's type name


def load_gguf(path: Path, dtype: torch.dtype = torch.float32, quant: str | None = None, keep_dense: bool = True,
              num_threads: int | None = None, cache_root: Path | None = None) -> GgufWeights:
    """The tensors of `path`, tensor by tensor (never a float32 copy of the whole model).

    quant None: every tensor dense in `dtype`. "int_dot": linears of a block type (quant/blocks.py) as
    int-dot tiles, the embedding and LM head as rows read from the file; dense copies of those too only
    with `keep_dense`. "torch_int4": everything dense, and the Q4_0/Q4_1 linears as blocks too.
    `cache_root` ("int_dot"): the tiles (and, through the head's rows, the int8 head) are kept there once
    converted and mapped from there at later loads (quant/converted_cache.py)."""
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
    out = GgufWeights(arch, {}, gguf_identity(header), path)
    cache = ConvertedCache(cache_root, out.identity, path) if cache_root is not None and quant == "int_dot" else None
    cached = cache.load("tiles") if cache is not None else None
    load = functools.partial(_load_tensor, data, arch=arch, dtype=dtype, quant=quant, keep_dense=keep_dense, out=out,
                             cached=cached or {})
    threads = num_threads or min(8, torch.get_num_threads())
    # numpy releases the GIL in the dequant kernels, so tensors load in parallel
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(lambda item: load(item[0], item[1]), wanted))
    del data  # unmapped: the pages read while packing leave this process (rows keep maps of their own)
    if cache is not None:
        for rows in out.rows.values():
            rows.cache = cache
        if cached is None and out.tiles:
            out.tiles = cache.save_and_map("tiles", out.tiles)  # the built tiles go: later starts' form
    if quant == "int_dot":
        logger.info("event=gguf_tiles source=%s tensors=%d", "converted" if cached is None else "cache", len(out.tiles))
    return out


def _load_tensor(data: np.memmap, info: GGUFTensorInfo, name: str, *, arch: ModelArch, dtype: torch.dtype,
                 quant: str | None, keep_dense: bool, out: GgufWeights, cached: dict[str, torch.Tensor]) -> None:
    """Puts tensor `name` into `out` in the forms asked for (dict stores are atomic under the GIL); `cached`:
    tiles converted at an earlier load."""
    from gguf import GGMLQuantizationType

    type_name = GGMLQuantizationType(info.ggml_type).name
    out.types[name] = type_name
    shape = tuple(info.shape)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    raw = data[info.offset:info.offset + info.nbytes].reshape(rows, info.nbytes // rows)  # [rows, bytes a row]
    matrix = (rows, shape[-1])  # stacked experts [E, N, K] as one [E * N, K]
    heads = _rope_heads(arch, name)
    kept = False  # whether the tensor is held in a quantized form (then dense only with keep_dense)
    if quant == "int_dot" and name in (EMBED, HEAD):
        out.rows[name] = GgufRows(out.path, info.offset, info.nbytes, type_name, (shape[0], shape[1]))
        kept = True
    elif quant == "int_dot" and name in cached:
        out.tiles[name] = cached[name]
        kept = True
    elif quant == "int_dot" and name.endswith("proj.weight") and raw_packable(type_name, shape):
        order = raw if not heads else raw[unpermute_rope_rows(torch.arange(shape[0]).unsqueeze(1), heads).squeeze(1).numpy()]
        try:
            out.tiles[name] = pack_raw(order, type_name, matrix)
            kept = True
        except ValueError as exc:  # a scale past float16's range: that tensor stays dense
            logger.warning("event=gguf_tensor_dense name=%s type=%s reason=%s", name, type_name, exc)
    elif quant == "torch_int4" and name.endswith("proj.weight") and block_type(type_name, shape) is not None:
        w = decode_blocks(raw, type_name, (shape[0], shape[1]))
        if heads:
            w = w.rows(unpermute_rope_rows(torch.arange(shape[0]).unsqueeze(1), heads).squeeze(1))
        if TorchInt4.accepts(w):
            out.q4[name] = w  # torch's path keeps the dense weights beside
    if not kept or keep_dense:
        tensor = _dense(raw, type_name, shape, dtype)
        out.tensors[name] = unpermute_rope_rows(tensor, heads) if heads else tensor
    drop_pages(data, info.offset, info.nbytes)  # read once: its file pages need not stay in RSS


def _rope_heads(arch: ModelArch, name: str) -> int:
    """llama.cpp permutes the Q/K rows of `llama` files (unpermute_rope_rows): their head count, else 0."""
    if arch.architecture != "llama":
        return 0
    if name.endswith("q_proj.weight"):
        return arch.num_heads
    return arch.num_kv_heads if name.endswith("k_proj.weight") else 0


DENSE_CHUNK = 1 << 24  # values dequantized at a time: a 64 MB float32 temporary at most


def _dense(raw: np.ndarray, type_name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """raw [rows, bytes a row] -> the tensor in `dtype`, dequantized by the `gguf` package chunk by chunk."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[type_name]
    rows, cols = raw.shape[0], int(np.prod(shape)) // raw.shape[0]
    out = torch.empty(rows, cols, dtype=dtype)
    step = max(1, DENSE_CHUNK // cols)
    for start in range(0, rows, step):
        values = np.asarray(dequantize(raw[start:start + step], qtype), dtype=np.float32).reshape(-1, cols)
        if not values.flags.writeable:  # F32 comes back as a view of the read-only map
            values = values.copy()
        out[start:start + step] = torch.from_numpy(values)
    return out.reshape(shape)


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation.

    llama.cpp: w.reshape(heads, 2, half, ...).swapaxes(1, 2) -> rows ordered (head, half, 2).
    Inverse:   w.reshape(heads, half, 2, ...).swapaxes(1, 2) -> rows ordered (head, 2, half).
    """
    half = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])  # [heads, half, 2, in]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()
