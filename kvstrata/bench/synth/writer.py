"""Write a random-weight GGUF of a `ModelShape` tensor by tensor (header first, then each tensor's bytes
as it is made), so even an 8B model never sits whole in memory.

Tensor names and metadata are llama.cpp's; the tokenizer (vocabulary, merges, chat template) is copied
from another GGUF (SmolLM2's). Weights are random blocks (random_blocks.py) of the type `types(name)`
gives, norms are ones and Qwen2's q/k/v biases small random values; Qwen3 gets its q/k norms and
head size, and a shape with YaRN the rope scaling keys llama.cpp's converter writes. Q/K rows are not permuted as
llama.cpp's converter permutes real checkpoints: for random values that changes nothing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kvstrata.bench.synth.ending import rig
from kvstrata.bench.synth.random_blocks import random_blocks
from kvstrata.bench.synth.shapes import ModelShape
from kvstrata.model.quant.blocks import BLOCK_TYPES

# scale of each type's float16 fields: weights of a few hundredths, activations that stay finite over
# every layer (Q8_0's d times values up to 127; K-quants' d times 6-bit scales, times values up to 63)
SCALES = {"Q8_0": 2e-4, "Q4_0": 4e-3, "Q4_1": 4e-3, "Q5_0": 2e-3, "Q5_1": 2e-3, "Q4_K": 1e-4, "Q5_K": 5e-5,
          "Q6_K": 5e-5}


def tensor_shapes(shape: ModelShape, untied: bool = False) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(GGUF name, torch-order shape) of every tensor, in llama.cpp's order; `untied`: an LM head of its
    own even where the shape ties it (ending.py)."""
    h, kv, d = shape.hidden, shape.kv_heads * shape.head_dim, shape.heads * shape.head_dim
    yield "token_embd.weight", (shape.vocab, h)
    for i in range(shape.layers):
        yield f"blk.{i}.attn_norm.weight", (h,)
        yield f"blk.{i}.attn_q.weight", (d, h)
        yield f"blk.{i}.attn_k.weight", (kv, h)
        yield f"blk.{i}.attn_v.weight", (kv, h)
        if shape.arch == "qwen3":
            yield f"blk.{i}.attn_q_norm.weight", (shape.head_dim,)
            yield f"blk.{i}.attn_k_norm.weight", (shape.head_dim,)
        if shape.arch == "qwen2":
            yield f"blk.{i}.attn_q.bias", (d,)
            yield f"blk.{i}.attn_k.bias", (kv,)
            yield f"blk.{i}.attn_v.bias", (kv,)
        yield f"blk.{i}.attn_output.weight", (h, d)
        yield f"blk.{i}.ffn_norm.weight", (h,)
        yield f"blk.{i}.ffn_gate.weight", (shape.ffn, h)
        yield f"blk.{i}.ffn_up.weight", (shape.ffn, h)
        yield f"blk.{i}.ffn_down.weight", (h, shape.ffn)
    yield "output_norm.weight", (h,)
    if not shape.tied or untied:
        yield "output.weight", (shape.vocab, h)


def write_gguf(path: Path, shape: ModelShape, types: Callable[[str], str], tokenizer_from: Path, seed: int = 0,
               ends_replies: int | None = None, chat_template: str | None = None) -> None:
    """Write the model to `path`; `types(name)` is the block type of each 2-D weight (BLOCK_TYPES);
    `ends_replies`: an end-of-turn token id its replies end with (ending.py; Q8_0 weights only);
    `chat_template`: the template to write instead of the tokenizer GGUF's."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    a = shape.arch
    for key, value in {"block_count": shape.layers, "context_length": shape.context, "embedding_length": shape.hidden,
                       "feed_forward_length": shape.ffn, "attention.head_count": shape.heads,
                       "attention.head_count_kv": shape.kv_heads, "rope.dimension_count": shape.head_dim,
                       "attention.key_length": shape.head_dim, "attention.value_length": shape.head_dim,
                       "vocab_size": shape.vocab}.items():
        writer.add_uint32(f"{a}.{key}", value)
    if shape.yarn is not None:
        writer.add_string(f"{a}.rope.scaling.type", "yarn")
        writer.add_float32(f"{a}.rope.scaling.factor", shape.yarn[0])
        writer.add_uint32(f"{a}.rope.scaling.original_context_length", shape.yarn[1])
    writer.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_string("general.name", f"kvstrata synthetic {a} {shape.hidden}x{shape.layers}")
    copy_tokenizer(writer, tokenizer_from, chat_template)
    plan = list(tensor_shapes(shape, untied=ends_replies is not None))
    for name, dims in plan:
        if len(dims) == 1:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * dims[0])
        else:
            kind = types(name)
            per, nbytes, _, _ = BLOCK_TYPES[kind]
            row = dims[1] // per * nbytes
            writer.add_tensor_info(name, (dims[0], row), np.dtype(np.uint8), dims[0] * row,
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims in plan:
        if len(dims) == 1:
            data = np.ones(dims, np.float32) if "norm" in name else (rng.standard_normal(dims) * 0.02).astype(np.float32)
        else:
            kind = types(name)
            data = random_blocks(kind, dims[0], dims[1], rng, SCALES[kind])
            if ends_replies is not None:
                if kind != "Q8_0":
                    raise ValueError(f"--ends-replies rigs Q8_0 weights; {name} is {kind}")
                data = rig(name, data, shape.hidden, ends_replies)
        writer.write_tensor_data(data)
    writer.close()


def copy_tokenizer(writer: object, source: Path, chat_template: str | None = None) -> None:
    """Every `tokenizer.*` key of the GGUF `source` into `writer` (a gguf.GGUFWriter), the chat template
    replaced by `chat_template` where given."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    if chat_template is not None:
        writer.add_string("tokenizer.chat_template", chat_template)  # type: ignore[attr-defined]
    for key, field in reader.fields.items():
        if key == "tokenizer.chat_template" and chat_template is not None:
            continue
        if key.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), vtype, sub)  # type: ignore[attr-defined]
