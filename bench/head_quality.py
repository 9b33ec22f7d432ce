"""How far the quantized LM heads' logits are from the exact head's, on a model's real head inputs.

    PYTHONPATH=. python bench/head_quality.py [--model smollm2] [--prompts 24] [--tokens 32]

Runs `--prompts` chat prompts (bench bf16-drift's topics) greedily for `--tokens` tokens, records every
input of the LM head (the final norm's output), and then for each head form (the int8 head, the 4-bit
one: quant/int8_head.py, quant/q4_head.py) and each number of rescored candidates prints: how often the
exact head's argmax is among the candidates (greedy keeps the exact argmax then), how often the final
argmax is the exact one, and at temperature 1 the KL divergence and total variation between the exact
softmax and the one sampled from (mean and max over the steps). The exact head: the model's dense head, or
the GGUF's own rows of it in float32.
"""
from __future__ import annotations

import argparse
import random
import sys
from typing import Any

import torch

sys.path.insert(0, ".")
from kvstrata.bench.bf16_drift import TOPICS  # noqa: E402
from kvstrata.engine.llm import LLM  # noqa: E402
from kvstrata.engine.sampling_params import SamplingParams  # noqa: E402
from kvstrata.model.quant.int8_head import Int8Head, rescore_top  # noqa: E402
from kvstrata.model.quant.q4_head import Q4Head  # noqa: E402


class Recorder:
    """Stands in for the model's head: keeps each input, returns the head's logits."""

    def __init__(self, head: Any) -> None:
        self.head, self.inputs = head, []  # type: ignore[var-annotated]

    def __call__(self, x: torch.Tensor, narrow: bool, wide_rescore: bool = False) -> torch.Tensor:
        self.inputs.append(x.detach().float().clone())
        return self.head(x, narrow, wide_rescore)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    llm = LLM(a.model, enable_prefix_caching=False, speculative="off")
    model = llm.engine.model
    head = model.head
    recorder = Recorder(head)
    model.head = recorder
    tok = llm.tokenizer
    topics = random.Random(0).sample(TOPICS, min(a.prompts, len(TOPICS)))
    for t in topics:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Tell me about {t}."}]))
        llm.generate([ids], SamplingParams(max_tokens=a.tokens, temperature=0.0))
    model.head = head
    x = torch.cat(recorder.inputs)
    source, vocab, hidden = head.exact_source()
    weights = source(0, vocab).float()
    exact = x @ weights.T
    best = exact.argmax(-1)
    rows = lambda start, stop: weights[start:stop]  # noqa: E731  (decoded once above, not again per form)
    forms = {"int8": Int8Head.from_rows(rows, vocab, hidden, True), "4-bit": Q4Head.from_rows(rows, vocab, hidden)}
    print(f"model={a.model} steps={x.shape[0]} vocab={vocab} hidden={hidden}")
    p_exact = torch.log_softmax(exact, -1)
    for name, form in forms.items():
        approx = form.approx_logits(x)
        for k in (32, 256):
            top = approx.topk(k, dim=-1).indices
            final = rescore_top(approx.clone(), x, weights, k)
            p = torch.log_softmax(final, -1)
            kl = (p_exact.exp() * (p_exact - p)).sum(-1)
            tv = 0.5 * (p_exact.exp() - p.exp()).abs().sum(-1)
            print(f"{name} head, top {k} rescored: exact argmax among them {(top == best[:, None]).any(-1).sum()}/{len(x)}, "
                  f"final argmax exact {(final.argmax(-1) == best).sum()}/{len(x)}; temperature 1: KL mean {kl.mean():.2e} "
                  f"max {kl.max():.2e}, total variation mean {tv.mean():.2%} max {tv.max():.2%}")


if __name__ == "__main__":
    main()
