"""Write bench/lm_eval/alice_cloze.jsonl: a last-word cloze task over bench/texts/alice-chapters-1-7.txt
(public domain), for lm-evaluation-harness's `local-completions` model (a loglikelihood task: each choice's
log-probability after the context, through `echo` + `logprobs`).

Each item is one sentence of at least 8 words: the context is the sentence without its last word, the
choices are that word and 3 other sentences' last words (drawn with a fixed seed), each with its leading
space. Run from the repository root: `python bench/lm_eval/make_alice_cloze.py` (it rewrites the file the
same way every time)."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

TEXT = Path("bench/texts/alice-chapters-1-7.txt")
OUT = Path("bench/lm_eval/alice_cloze.jsonl")
ITEMS = 300
SEED = 0


def sentences(text: str) -> list[tuple[str, str]]:
    """(context, last word) of each sentence of 8+ plain words ending in '.', '!' or '?'."""
    flat = re.sub(r"\s+", " ", text)
    out = []
    for s in re.split(r"(?<=[.!?])\s+", flat):
        words = s.rstrip(".!?").split(" ")
        last = words[-1]
        if len(words) >= 8 and re.fullmatch(r"[A-Za-z]+", last):
            out.append((" ".join(words[:-1]), last))
    return out


def main() -> None:
    rng = random.Random(SEED)
    pool = sentences(TEXT.read_text(encoding="utf-8"))
    picked = rng.sample(pool, ITEMS)
    lines = []
    for context, word in picked:
        others = sorted({w for _, w in pool if w.lower() != word.lower()})
        choices = [word, *rng.sample(others, 3)]
        rng.shuffle(choices)
        lines.append(json.dumps({"context": context, "choices": [" " + c for c in choices],
                                 "label": choices.index(word)}))
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(lines)} items from {len(pool)} sentences")


if __name__ == "__main__":
    main()
