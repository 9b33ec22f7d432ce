"""Model shapes for synthetic GGUFs: the published configs' sizes, SmolLM2's vocabulary (its tokenizer
is the one kept locally; a larger vocabulary changes only the embedding and head)."""
from __future__ import annotations

from typing import NamedTuple


class ModelShape(NamedTuple):
    arch: str  # the GGUF architecture: llama, qwen2 or qwen3 (q/k norms)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool  # the LM head is the embedding
    rope_theta: float = 500000.0
    context: int = 8192
    vocab: int = 49152
    dim: int = 0  # head size where it is not hidden / heads (Qwen3); 0: hidden / heads
    yarn: tuple[float, int] | None = None  # (factor, original context): YaRN rope scaling, as llama.cpp writes it

    @property
    def head_dim(self) -> int:
        return self.dim or self.hidden // self.heads

    def params(self) -> int:
        kv, q = self.kv_heads * self.head_dim, self.heads * self.head_dim
        per_layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.ffn
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)


SHAPES: dict[str, ModelShape] = {
    "llama-3.2-1b": ModelShape("llama", 2048, 16, 32, 8, 8192, tied=True),
    "llama-3.2-3b": ModelShape("llama", 3072, 28, 24, 8, 8192, tied=True),
    "llama-3.1-8b": ModelShape("llama", 4096, 32, 32, 8, 14336, tied=False),
    "qwen2.5-7b": ModelShape("qwen2", 3584, 28, 28, 4, 18944, tied=False, rope_theta=1000000.0),
    # Qwen3 at its native 32k context (the published configs say 40960 positions, 32k trained)
    "qwen3-0.6b": ModelShape("qwen3", 1024, 28, 16, 8, 3072, tied=True, rope_theta=1e6, context=32768, dim=128),
    "qwen3-1.7b": ModelShape("qwen3", 2048, 28, 16, 8, 6144, tied=True, rope_theta=1e6, context=32768, dim=128),
    "qwen3-4b": ModelShape("qwen3", 2560, 36, 32, 8, 9728, tied=True, rope_theta=1e6, context=32768, dim=128),
    "qwen3-8b": ModelShape("qwen3", 4096, 36, 32, 8, 12288, tied=False, rope_theta=1e6, context=32768, dim=128),
    # Qwen3-4B past its trained 32k with the YaRN its model card names (factor 4 over 32768)
    "qwen3-4b-yarn": ModelShape("qwen3", 2560, 36, 32, 8, 9728, tied=True, rope_theta=1e6, context=131072, dim=128,
                                yarn=(4.0, 32768)),
    "tiny": ModelShape("llama", 512, 2, 8, 2, 1024, tied=True, context=2048),  # a few MB, for tests
    "tiny-qwen3": ModelShape("qwen3", 256, 2, 4, 2, 512, tied=True, rope_theta=1e6, context=32768, dim=128,
                             yarn=(4.0, 8192)),  # the Qwen3 layout and YaRN, a few MB, for tests
}
