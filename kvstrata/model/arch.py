"""`ModelArch`: the shape of a Llama-family decoder, read from a HF config.json or GGUF metadata.

Both sources describe the same few numbers under different names; this is the one place that
knows both spellings. Everything downstream (weights, forward, KV pool, cache namespace) reads
the architecture from here, never from the raw config.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe")

# HF `architectures[0]` -> our architecture name.
_HF_CLASSES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
}
_QK_NORM = ("qwen3", "qwen3moe")  # per-head q/k RMSNorm before RoPE


@dataclass(frozen=True)
class ModelArch:
    architecture: str  # "llama" | "qwen2" | "qwen3" | "qwen3moe"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # q/k/v projections carry a bias (qwen2)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (qwen3)
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # sorted (key, value) pairs, hashable
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # mixture of experts (qwen3moe; model/moe.py): 0 experts = every layer's MLP is the dense one
    num_experts: int = 0  # routed experts of an MoE layer
    num_experts_per_tok: int = 0  # the top-k experts each token runs
    moe_intermediate_size: int = 0  # an expert's SwiGLU width
    norm_topk_prob: bool = False  # the top-k routing probabilities renormalised to sum to 1
    dense_layers: tuple[int, ...] = ()  # layers of an MoE model whose MLP is the dense one (intermediate_size)

    def moe_layer(self, i: int) -> bool:
        """Whether layer i's MLP is an MoE block (else the dense MLP)."""
        return self.num_experts > 0 and i not in self.dense_layers

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelArch:
        """Build from the dict of a Hugging Face `config.json`."""
        architecture = _hf_architecture(config)
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        rope_params = dict(config.get("rope_parameters") or {})
        rope_theta = config.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = config.get("rope_scaling") or {
            k: v for k, v in rope_params.items() if k != "rope_theta"
        }
        if architecture == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
            raise ValueError(
                "Llama checkpoints with attention_bias/mlp_bias are not supported; "
                "use a checkpoint without projection biases."
            )
        return cls(
            architecture=architecture,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=architecture == "qwen2" or bool(config.get("attention_bias", False)),
            qk_norm=architecture in _QK_NORM,
            rope_scaling=_freeze_rope_scaling(scaling),
            bos_token_id=_optional_int(config.get("bos_token_id")),
            eos_token_ids=_id_tuple(config.get("eos_token_id")),
            **(_hf_moe(config) if architecture == "qwen3moe" else {}),
        )

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], tensor_names: Collection[str] = ()
    ) -> ModelArch:
        """Build from GGUF key/value metadata; `tensor_names` (GGUF spelling) tells tying, biases, qk-norm."""
        architecture = str(metadata.get("general.architecture", ""))
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {architecture!r} is not supported; "
                f"use a GGUF of one of {list(SUPPORTED_ARCHITECTURES)}."
            )

        def key(name: str, default: Any = None) -> Any:
            value = metadata.get(f"{architecture}.{name}", default)
            if value is None:
                raise ValueError(f"GGUF metadata lacks {architecture}.{name}; the file looks incomplete.")
            return value

        hidden = int(key("embedding_length"))
        heads = int(key("attention.head_count"))
        vocab = metadata.get(f"{architecture}.vocab_size")
        if vocab is None:
            vocab = len(metadata["tokenizer.ggml.tokens"])
        names = set(tensor_names)
        eos = [metadata.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
        moe: dict[str, Any] = {}
        if architecture == "qwen3moe":  # llama.cpp runs every layer as MoE and always renormalises the top-k
            moe = dict(num_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
                       moe_intermediate_size=int(key("expert_feed_forward_length")),
                       norm_topk_prob=bool(key("expert_weights_norm", True)))
        return cls(
            architecture=architecture,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length", moe.get("moe_intermediate_size"))),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(key("attention.head_count_kv", heads)),
            head_dim=int(key("attention.key_length", hidden // heads)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            max_position=int(key("context_length")),
            tie_word_embeddings="output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
            rope_scaling=_gguf_rope_scaling(metadata, architecture),
            bos_token_id=_optional_int(metadata.get("tokenizer.ggml.bos_token_id")),
            eos_token_ids=_id_tuple([e for e in eos if e is not None]),
            **moe,
        )


def _hf_moe(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Qwen3MoeConfig's MoE fields; its dense layers as transformers' Qwen3MoeDecoderLayer picks them
    (listed in mlp_only_layers, or off the every-`decoder_sparse_step`-th layer, or no experts at all)."""
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)  # transformers 5 saves the latter
    step = int(config.get("decoder_sparse_step") or 1)
    only = {int(i) for i in config.get("mlp_only_layers") or ()}
    dense = tuple(i for i in range(int(config["num_hidden_layers"]))
                  if i in only or not (experts > 0 and (i + 1) % step == 0))
    return dict(num_experts=experts, num_experts_per_tok=int(config.get("num_experts_per_tok") or 0),
                moe_intermediate_size=int(config.get("moe_intermediate_size") or 0),
                norm_topk_prob=bool(config.get("norm_topk_prob", False)), dense_layers=dense)


def _hf_architecture(config: Mapping[str, Any]) -> str:
    classes = list(config.get("architectures") or [])
    for name in classes:
        if name in _HF_CLASSES:
            return _HF_CLASSES[name]
    if not classes and config.get("model_type") in SUPPORTED_ARCHITECTURES:
        return str(config["model_type"])
    raise ValueError(
        f"unsupported model architecture {classes or config.get('model_type')!r}; "
        f"kvstrata runs {sorted(_HF_CLASSES)} checkpoints."
    )


def _gguf_rope_scaling(metadata: Mapping[str, Any], architecture: str) -> tuple[tuple[str, Any], ...] | None:
    prefix = f"{architecture}.rope.scaling."
    kind = metadata.get(prefix + "type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind}
    if (factor := metadata.get(prefix + "factor")) is not None:
        scaling["factor"] = float(factor)
    if (original := metadata.get(prefix + "original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(original)
    for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):  # llama.cpp's names
        if (value := metadata.get(prefix + gguf_key)) is not None:
            scaling[hf_key] = float(value)
    return _freeze_rope_scaling(scaling)


def _freeze_rope_scaling(scaling: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    """Sorted (key, value) pairs with lists turned into tuples; None for default RoPE."""
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default") and set(scaling) <= {"rope_type", "type"}:
        return None
    return tuple(sorted((str(k), _freeze(v)) for k, v in scaling.items()))


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    return value


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _id_tuple(value: Any) -> tuple[int, ...]:
    """An int, a list of ints or None -> a tuple of unique ints in order."""
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    return tuple(dict.fromkeys(int(v) for v in items))
