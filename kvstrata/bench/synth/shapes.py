"""Model shapes for synthetic GGUFs: the published configs' sizes, SmolLM2's vocabulary (its tokenizer
is the one this machine has; a larger vocabulary changes only the embedding and head)."""
from __future__ import annotations

from typing import NamedTuple


class ModelShape(NamedTuple):
    arch: str  # the GGUF architecture: llama or qwen2
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool  # the LM head is the embedding
    rope_theta: float = 500000.0
    context: int = 8192
    vocab: int = 49152

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        kv = self.kv_heads * self.head_dim
        per_layer = self.hidden * (self.hidden + 2 * kv) + self.hidden * self.hidden + 3 * self.hidden * self.ffn
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)


SHAPES: dict[str, ModelShape] = {
    "llama-3.2-1b": ModelShape("llama", 2048, 16, 32, 8, 8192, tied=True),
    "llama-3.2-3b": ModelShape("llama", 3072, 28, 24, 8, 8192, tied=True),
    "llama-3.1-8b": ModelShape("llama", 4096, 32, 32, 8, 14336, tied=False),
    "qwen2.5-7b": ModelShape("qwen2", 3584, 28, 28, 4, 18944, tied=False, rope_theta=1000000.0),
    "tiny": ModelShape("llama", 512, 2, 8, 2, 1024, tied=True, context=2048),  # a few MB, for tests
}
