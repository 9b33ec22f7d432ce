"""A tiny random-weight Qwen3-MoE for the MoE tests: a Hugging Face folder (transformers' own save) and
the same weights as a GGUF written as llama.cpp's converter (convert_hf_to_gguf.py, Qwen3MoeModel)
writes one: its metadata keys, tensor names and shapes (experts stacked [experts, out, in]), in F32 or
with the experts in a block type. SmolLM2's tokenizer: a vocabulary the converter knows."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvstrata.bench.synth.writer import copy_tokenizer
from kvstrata.model.gguf_loader import hf_name
from kvstrata.model.weights import load_weights

TINY_MOE = dict(vocab_size=49152, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                norm_topk_prob=True, max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                eos_token_id=2)


def save_folder(out: Path, tokenizer_gguf: Path, **overrides: Any) -> Any:
    """The model (TINY_MOE with `overrides`) saved to `out` with the tokenizer of `tokenizer_gguf`;
    returns transformers' model, in eval mode. Every weight is drawn wide (norms too), so routing spreads
    over the experts and a mix-up of any tensor shows."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**{**TINY_MOE, **overrides}))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.save_pretrained(out)
    tf.AutoTokenizer.from_pretrained(str(tokenizer_gguf.parent), gguf_file=tokenizer_gguf.name).save_pretrained(out)
    return model.eval()


def gguf_names(layers: int) -> dict[str, str]:
    """HF name -> GGUF name of every tensor llama.cpp's qwen3moe defines (gguf's table): each must map."""
    import gguf

    out = {}
    for tensor in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE]:
        template = gguf.TENSOR_NAMES[tensor]
        for i in range(layers) if "{bid}" in template else [0]:
            name = template.format(bid=i) + ".weight"
            hf = hf_name(name)
            assert hf is not None, f"{name}: no HF name"
            out[hf] = name
    return out


def write_gguf(path: Path, folder: Path, tokenizer_gguf: Path, expert_type: str = "F32") -> None:
    """The folder's model as a GGUF: llama.cpp's qwen3moe keys, its tensors under their GGUF names, the
    experts (stacked as the converter stacks them) in `expert_type`, every other tensor F32."""
    import gguf

    w = load_weights(folder)  # HF names, experts stacked [experts, out, in]
    a = w.arch
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    for key, value in {"block_count": a.num_layers, "context_length": a.max_position, "embedding_length": a.hidden_size,
                       "feed_forward_length": a.intermediate_size, "attention.head_count": a.num_heads,
                       "attention.head_count_kv": a.num_kv_heads, "expert_count": a.num_experts,
                       "expert_used_count": a.num_experts_per_tok, "attention.key_length": a.head_dim,
                       "attention.value_length": a.head_dim, "expert_feed_forward_length": a.moe_intermediate_size}.items():
        writer.add_uint32(f"qwen3moe.{key}", value)
    writer.add_float32("qwen3moe.rope.freq_base", a.rope_theta)
    writer.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", a.rms_norm_eps)
    copy_tokenizer(writer, tokenizer_gguf)
    names = gguf_names(a.num_layers)
    for hf, tensor in w.tensors.items():
        qtype = gguf.GGMLQuantizationType[expert_type if ".experts." in hf else "F32"]
        data = gguf.quants.quantize(np.ascontiguousarray(tensor.numpy()), qtype)
        writer.add_tensor(names[hf], data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
