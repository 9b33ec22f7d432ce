"""Random GGUF blocks: any byte pattern is a valid block of a type once its float16 fields are finite,
so random bytes with chosen scales stand in for a quantizer (the `gguf` package quantizes only
Q4_0/1, Q5_0/1 and Q8_0, and slowly)."""
from __future__ import annotations

import numpy as np

from kvstrata.model.quant.blocks import BLOCK_TYPES

FLOAT16_FIELDS = {"Q4_0": (0, 2), "Q5_0": (0, 2), "Q8_0": (0, 2), "Q4_1": (0, 4), "Q5_1": (0, 4),
                  "Q4_K": (0, 4), "Q5_K": (0, 4), "Q6_K": (208, 210)}  # the byte range of a block's float16s


def random_blocks(type_name: str, n: int, k: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """[n, bytes a row] of random `type_name` blocks for an [n, k] weight, float16 fields uniform in
    (scale / 10, 1.1 scale)."""
    per, nbytes, _, _ = BLOCK_TYPES[type_name]
    raw = rng.integers(0, 256, size=(n, k // per, nbytes), dtype=np.uint8)
    lo, hi = FLOAT16_FIELDS[type_name]
    halves = (rng.random((n, k // per, (hi - lo) // 2), dtype=np.float32) * scale + scale / 10).astype(np.float16)
    raw[..., lo:hi] = halves.view(np.uint8)
    return raw.reshape(n, -1)
