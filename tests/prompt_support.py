"""Token-id prompts for engine tests on the random-weight model."""
from __future__ import annotations

import random


def repetitive_prompts(n: int, seed: int = 0, max_repeats: int = 8) -> list[list[int]]:
    """Prompts that repeat a phrase, so that a random-weight model's output (which loops) and the
    prompt give the drafter matches, and penalties something to act on."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(3, 49000) for _ in range(rng.randint(3, 9))]
        out.append([rng.randrange(3, 49000) for _ in range(rng.randint(2, 30))] + phrase * rng.randint(2, max_repeats))
    return out
