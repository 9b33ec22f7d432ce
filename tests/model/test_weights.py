"""load_weights: exact equality with transformers' tensors for the real GGUF and HF folders."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from kvstrata.model.arch import ModelArch
from kvstrata.model.gguf_header import gguf_identity, read_gguf_header
from kvstrata.model.gguf_loader import unpermute_rope_rows
from kvstrata.model.weights import LoadedWeights, expected_tensor_names, load_weights


@pytest.fixture(scope="module")
def gguf_weights(smollm2_path: Path) -> LoadedWeights:
    return load_weights(smollm2_path)


def assert_same_tensors(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32 and tensor.device.type == "cpu", name
        assert torch.equal(tensor, reference[name].to(torch.float32)), f"{name} differs from the reference"


# ---- the real SmolLM2 GGUF -------------------------------------------------------------------

def test_gguf_arch(gguf_weights: LoadedWeights) -> None:
    assert gguf_weights.arch == ModelArch(
        architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
        num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=gguf_weights.arch.rms_norm_eps,
        max_position=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
    )
    assert gguf_weights.arch.rms_norm_eps == pytest.approx(1e-5)
    hash(gguf_weights.arch)  # frozen and hashable


def test_gguf_equals_transformers(gguf_weights: LoadedWeights, hf_state_dict: dict[str, Any]) -> None:
    assert list(gguf_weights.tensors) == expected_tensor_names(gguf_weights.arch)
    # transformers lists the tied lm_head too; we do not.
    assert set(hf_state_dict) - set(gguf_weights.tensors) == {"lm_head.weight"}
    assert_same_tensors(gguf_weights.tensors, hf_state_dict)
    q = gguf_weights.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (576, 576) and gguf_weights.tensors["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)


def test_gguf_identity(gguf_weights: LoadedWeights, smollm2_path: Path, tmp_path: Path) -> None:
    identity = gguf_weights.identity
    assert identity.startswith("SmolLM2-135M-Instruct.Q4_1-98362432-")
    assert identity == gguf_identity(read_gguf_header(smollm2_path))  # stable across reads
    copy = tmp_path / smollm2_path.name
    shutil.copyfile(smollm2_path, copy)
    assert gguf_identity(read_gguf_header(copy)) == identity  # content, not location
    header = read_gguf_header(copy)
    with open(copy, "r+b") as f:  # change the first weight byte: a different model
        f.seek(header.data_offset)
        byte = f.read(1)
        f.seek(header.data_offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert gguf_identity(read_gguf_header(copy)) != identity


# ---- Hugging Face safetensors folders --------------------------------------------------------

def test_safetensors_folder_equals_transformers(hf_folder: Path, hf_state_dict: dict[str, Any],
                                                gguf_weights: LoadedWeights) -> None:
    loaded = load_weights(hf_folder)
    assert list(loaded.tensors) == expected_tensor_names(loaded.arch)
    assert_same_tensors(loaded.tensors, hf_state_dict)
    for field in ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "rope_theta", "rms_norm_eps", "max_position", "tie_word_embeddings"):
        assert getattr(loaded.arch, field) == getattr(gguf_weights.arch, field), field
    assert loaded.identity != gguf_weights.identity and loaded.source_path == hf_folder


def _save_tiny(model_cls: Any, config: Any, out: Path, **save_kwargs: Any) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():  # give norms and biases non-trivial values so a mix-up would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.copy_(torch.randn_like(p))
    model.save_pretrained(out, **save_kwargs)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_tiny_qwen2_folder_sharded_bf16(tmp_path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, rope_theta=1e6, eos_token_id=[5, 7], bos_token_id=3,
                         dtype="bfloat16")
    reference = _save_tiny(Qwen2ForCausalLM, config, tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded = load_weights(tmp_path)
    arch = loaded.arch
    assert (arch.architecture, arch.attention_bias, arch.qk_norm) == ("qwen2", True, False)
    assert arch.tie_word_embeddings is False
    assert (arch.head_dim, arch.rope_theta, arch.eos_token_ids, arch.bos_token_id) == (16, 1e6, (5, 7), 3)
    assert list(loaded.tensors) == expected_tensor_names(arch)
    assert "model.layers.1.self_attn.k_proj.bias" in loaded.tensors and "lm_head.weight" in loaded.tensors
    assert_same_tensors(loaded.tensors, reference)


def test_tiny_qwen3_folder_qk_norm_and_head_dim(tmp_path: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=True,
                         rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    reference = _save_tiny(Qwen3ForCausalLM, config, tmp_path)
    loaded = load_weights(tmp_path)
    arch = loaded.arch
    assert (arch.architecture, arch.qk_norm, arch.attention_bias, arch.head_dim) == ("qwen3", True, False, 32)
    assert dict(arch.rope_scaling)["rope_type"] == "yarn" and dict(arch.rope_scaling)["factor"] == 4.0
    assert "model.layers.0.self_attn.q_norm.weight" in loaded.tensors and "lm_head.weight" not in loaded.tensors
    assert loaded.tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert list(loaded.tensors) == expected_tensor_names(arch)
    assert_same_tensors(loaded.tensors, reference)


# ---- tiny GGUF files written here: types, permutation, qwen2 naming ---------------------------

_GGUF_BLOCK = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
               "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def permute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's Q/K row permutation (what its converter applies); the inverse of `unpermute_rope_rows`."""
    half = weight.shape[0] // num_heads // 2
    w = weight.reshape(num_heads, 2, half, *weight.shape[1:])  # [heads, 2, half, in]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.(self_attn|mlp).X.kind  or  model.layers.N.X.kind
    return f"blk.{parts[2]}.{_GGUF_BLOCK[parts[-2]]}.{parts[-1]}"


def _write_tiny_gguf(path: Path, arch: str, hf: dict[str, torch.Tensor], heads: int, kv_heads: int,
                     qtypes: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Write `hf` tensors as llama.cpp would; return what a loader must give back (after quantization)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    hidden = hf["model.embed_tokens.weight"].shape[1]
    for key, value in {"block_count": 2, "context_length": 256, "embedding_length": hidden,
                       "feed_forward_length": hf["model.layers.0.mlp.up_proj.weight"].shape[0],
                       "attention.head_count": heads, "attention.head_count_kv": kv_heads}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2)
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(hf["model.embed_tokens.weight"].shape[0])])
    expected = {}
    for name, tensor in hf.items():
        stored = tensor.numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            stored = permute_rope_rows(tensor, heads if "q_proj" in name else kv_heads).numpy()
        qtype = qtypes.get(name.rsplit(".", 2)[-2], gguf.GGMLQuantizationType.F32) if stored.ndim == 2 \
            else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(stored, qtype)
        writer.add_tensor(_gguf_name(name), data, raw_dtype=qtype)
        back = torch.from_numpy(np.array(gguf.quants.dequantize(data, qtype), dtype=np.float32)).reshape(tensor.shape)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            back = unpermute_rope_rows(back, heads if "q_proj" in name else kv_heads)
        expected[name] = back
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def _random_tensors(arch: ModelArch) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    q_out, kv_out = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = {"q_proj": (q_out, arch.hidden_size), "k_proj": (kv_out, arch.hidden_size),
              "v_proj": (kv_out, arch.hidden_size), "o_proj": (arch.hidden_size, q_out),
              "gate_proj": (arch.intermediate_size, arch.hidden_size),
              "up_proj": (arch.intermediate_size, arch.hidden_size),
              "down_proj": (arch.hidden_size, arch.intermediate_size), "embed_tokens": (arch.vocab_size, arch.hidden_size),
              "lm_head": (arch.vocab_size, arch.hidden_size)}
    out = {}
    for name in expected_tensor_names(arch):
        part, kind = name.split(".")[-2:]
        if kind == "bias":
            shape = (shapes[part][0],)
        else:
            shape = shapes.get(part, (arch.head_dim,) if part in ("q_norm", "k_norm") else (arch.hidden_size,))
        out[name] = torch.randn(shape)
    return out


def test_tiny_gguf_llama_types_and_unpermute(tmp_path: Path) -> None:
    import gguf

    Q = gguf.GGMLQuantizationType
    arch = ModelArch("llama", 64, 64, 128, 2, 4, 2, 16, 10000.0, 1e-6, 256, tie_word_embeddings=False)
    hf = _random_tensors(arch)
    qtypes = {"q_proj": Q.F32, "k_proj": Q.Q8_0, "v_proj": Q.Q4_0, "o_proj": Q.Q4_1, "gate_proj": Q.F16,
              "up_proj": Q.BF16, "down_proj": Q.Q5_0, "embed_tokens": Q.Q8_0, "lm_head": Q.Q5_1}
    expected = _write_tiny_gguf(tmp_path / "tiny.gguf", "llama", hf, 4, 2, qtypes)
    loaded = load_weights(tmp_path / "tiny.gguf")
    assert loaded.arch.tie_word_embeddings is False and loaded.arch.vocab_size == 64
    assert list(loaded.tensors) == expected_tensor_names(loaded.arch)
    assert_same_tensors(loaded.tensors, expected)
    # F32 q_proj round-trips exactly: the un-permute really inverts llama.cpp's permute.
    q_name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(loaded.tensors[q_name], hf[q_name])


def test_tiny_gguf_qwen2_biases_not_permuted(tmp_path: Path) -> None:
    arch = ModelArch("qwen2", 64, 64, 128, 2, 4, 2, 16, 10000.0, 1e-6, 256, tie_word_embeddings=True,
                     attention_bias=True)
    hf = _random_tensors(arch)
    _write_tiny_gguf(tmp_path / "tiny-qwen2.gguf", "qwen2", hf, 4, 2, {})
    loaded = load_weights(tmp_path / "tiny-qwen2.gguf")
    assert (loaded.arch.architecture, loaded.arch.attention_bias) == ("qwen2", True)
    assert loaded.arch.tie_word_embeddings is True
    assert set(loaded.tensors) == set(hf)
    assert_same_tensors(loaded.tensors, hf)  # all F32: exact, and q/k untouched


# ---- errors a user can hit ---------------------------------------------------------------------

def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_weights(tmp_path / "nope.gguf")


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_weights(tmp_path)


def test_folder_without_safetensors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 8,
        "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_weights(tmp_path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="unsupported model architecture.*LlamaForCausalLM"):
        load_weights(tmp_path)


def test_not_a_gguf(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="neither a .gguf file nor a folder"):
        load_weights(tmp_path / "model.bin")
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_weights(tmp_path / "bad.gguf")


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported"):
        load_weights(tmp_path / "gpt2.gguf")


def test_incomplete_checkpoint(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    from safetensors.torch import save_file

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    state = LlamaForCausalLM(config).state_dict()
    del state["model.layers.0.mlp.up_proj.weight"]
    config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="1 tensors missing.*up_proj"):
        load_weights(tmp_path)
