"""Where one engine step's time goes: a cold prefill and decode steps at batch 1 and 8, offline.

    PYTHONPATH=. python bench/step_profile.py [--dtype float32] [--prefill 2048] [--context 2048]
        [--decode-steps 32] [--profile] [--q4-decode off] [--attention-backend auto|torch_sdpa|cpu_paged]
        [--fused-ops auto|off] [--fused-decode-layers auto|off] [--ab-decode-layers BLOCKS] [--ab-act-bits BLOCKS]
        [--ab-head-bits BLOCKS]

Prints wall ms for the cold prefill of one `--prefill`-token prompt and ms per decode step at batch 1
(one `--context`-token prompt) and batch 8 (eight `--context // 4`-token prompts); with `--profile`
also torch.profiler's top ops by self CPU time for each phase, and how much of the wall time no op
accounts for (Python between ops). With `--ab-decode-layers N`, only the decode steps at batch 1 and 8,
alternating 16-step blocks with a step's layers in one op (kvstrata/model/decode_layers.py) and with
the Python loop on one engine, N blocks each: the median ms per step of each; `--ab-act-bits N` alike
with 16-bit and 8-bit integer activations (`--activation-bits`), `--ab-head-bits N` with the int8 and the 4-bit
LM head (`--head-bits`).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any, Callable

import torch

sys.path.insert(0, ".")
from kvstrata.engine.llm import LLM  # noqa: E402
from kvstrata.engine.sampling_params import SamplingParams  # noqa: E402
from kvstrata.model.quant.int8_head import Int8Head  # noqa: E402
from kvstrata.model.quant.q4_head import Q4Head  # noqa: E402

GREEDY = SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True)


def prompts(seed: int, count: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 49000) for _ in range(length)] for _ in range(count)]


def profiled(fn: Callable[[], Any], on: bool, label: str) -> float:
    """Run fn, return wall seconds; print the top ops when `on`."""
    if not on:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
    avg = prof.key_averages()
    ops = sorted((e for e in avg if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    total_us = sum(e.self_cpu_time_total for e in ops)
    print(f"  [{label}] wall {wall * 1e3:.1f} ms, ops {total_us / 1e3:.1f} ms, "
          f"outside ops (Python) {max(0.0, wall * 1e3 - total_us / 1e3):.1f} ms (profiler overhead included)")
    for e in ops[:10]:
        print(f"    {e.key:<36} {e.self_cpu_time_total / 1e3:8.1f} ms  {e.count:6d} calls")
    return wall


def start_decoding(llm: LLM, batch: list[list[int]], label: str) -> None:
    """Add the batch and step until every request decodes, then two warm decode steps."""
    eng = llm.engine
    for i, p in enumerate(batch):
        eng.add_request(f"{label}-{i}-{time.monotonic_ns()}", p, GREEDY)
    while eng.num_waiting or any(r.num_computed_tokens < r.num_tokens - 1 for r in eng.scheduler.running):
        eng.step()
    for _ in range(2):  # warm the decode shapes
        eng.step()


def abort_running(llm: LLM) -> None:
    for rid in [r.request_id for r in llm.engine.scheduler.running]:
        llm.engine.abort_request(rid)


def decode_steps(llm: LLM, batch: list[list[int]], steps: int, profile: bool, label: str) -> float:
    """ms per decode step once every request has its first token."""
    eng = llm.engine
    start_decoding(llm, batch, label)

    def run() -> None:
        for _ in range(steps):
            eng.step()

    wall = profiled(run, profile, label)
    abort_running(llm)
    return wall / steps * 1e3


def ab_decode_layers(llm: LLM, batch: list[list[int]], blocks: int, label: str) -> None:
    """A step's layers in one op (model.decode_layers) against the Python loop."""
    model = llm.engine.model
    op = model.decode_layers
    if op is None:
        print(f"{label}: the decode-layers op does not apply to this model or CPU")
        return
    ab_blocks(llm, batch, blocks, label, {"one op": lambda: setattr(model, "decode_layers", op),
                                          "Python loop": lambda: setattr(model, "decode_layers", None)})
    model.decode_layers = op


def ab_blocks(llm: LLM, batch: list[list[int]], blocks: int, label: str, modes: dict[str, Callable[[], None]]) -> None:
    """ms per decode step in each mode (a function that sets it), alternating blocks of 16 steps on one
    engine, so the VM's slow phases hit every mode: medians."""
    eng = llm.engine
    start_decoding(llm, batch, label)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for b in range(len(modes) * blocks):
        mode = list(modes)[b % len(modes)]
        modes[mode]()
        t = time.perf_counter()
        for _ in range(16):
            eng.step()
        times[mode].append((time.perf_counter() - t) / 16 * 1e3)
    abort_running(llm)
    print(f"{label}: " + ", ".join(f"{m} {statistics.median(v):.2f} ms/step" for m, v in times.items())
          + f" (medians of {blocks} blocks of 16 steps each)")


def ab_act_bits(llm: LLM, batch: list[list[int]], blocks: int, label: str) -> None:
    """16-bit and 8-bit integer activations (the K/V the two write differ slightly; the step's work does not)."""
    model = llm.engine.model
    if not model.uses_int_dot:
        print(f"{label}: no linear runs on the integer-dot kernels here")
        return
    ab_blocks(llm, batch, blocks, label, {"16-bit activations": lambda: model.set_act_bits(16),
                                          "8-bit activations": lambda: model.set_act_bits(8)})
    model.set_act_bits(16)


def ab_head_bits(llm: LLM, batch: list[list[int]], blocks: int, label: str) -> None:
    """The int8 LM head against the 4-bit one (quant/q4_head.py), both built from the model's exact head rows
    (greedy: each rescores its top 32)."""
    head = llm.engine.model.head
    rows, vocab, hidden = head.exact_source()
    if not llm.engine.model.uses_int_dot:
        print(f"{label}: the 4-bit head runs on the integer-dot kernels, which this model does not use")
        return
    heads = {8: Int8Head.from_rows(rows, vocab, hidden, True), 4: Q4Head.from_rows(rows, vocab, hidden)}
    before = head.quant
    ab_blocks(llm, batch, blocks, label, {f"{bits}-bit head": (lambda h=h: setattr(head, "quant", h))
                                          for bits, h in heads.items()})
    head.quant = before


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--q4-decode", default="off")
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--attention-backend", default="auto", help="torch_sdpa, cpu_paged or auto (the server's default)")
    ap.add_argument("--fused-ops", default="auto", help="auto (the server's default) or off")
    ap.add_argument("--fused-decode-layers", default="auto", help="auto (the server's default) or off")
    ap.add_argument("--activation-bits", default="auto", help="auto (the server's default), 8 or 16")
    ap.add_argument("--prefill-weights", default="auto", help="auto (the server's default), dense, dequant or int")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ab-decode-layers", type=int, default=0, metavar="BLOCKS",
                    help="only compare decode steps with the layers in one op against the Python loop, BLOCKS each")
    ap.add_argument("--ab-act-bits", type=int, default=0, metavar="BLOCKS",
                    help="only compare decode steps with 16-bit and 8-bit integer activations, BLOCKS each")
    ap.add_argument("--ab-head-bits", type=int, default=0, metavar="BLOCKS",
                    help="only compare decode steps with the int8 and the 4-bit LM head, BLOCKS each")
    a = ap.parse_args()
    llm = LLM(a.model, dtype=a.dtype, q4_decode=a.q4_decode, enable_prefix_caching=False, max_total_tokens=16384,
              attention_backend=a.attention_backend, fused_ops=a.fused_ops,
              fused_decode_layers=a.fused_decode_layers, activation_bits=a.activation_bits,
              prefill_weights=a.prefill_weights, speculative="off")  # one token a row a step
    llm.generate([prompts(9, 1, 64)[0]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    if a.ab_decode_layers:
        ab_decode_layers(llm, prompts(1, 1, a.context), a.ab_decode_layers, f"decode b1 ctx {a.context}")
        ab_decode_layers(llm, prompts(2, 8, a.context // 4), a.ab_decode_layers, f"decode b8 ctx {a.context // 4}")
        return
    for blocks, ab in ((a.ab_act_bits, ab_act_bits), (a.ab_head_bits, ab_head_bits)):
        if blocks:
            for batch in (1, 8):
                ab(llm, prompts(batch, batch, a.context // batch), blocks, f"decode b{batch} ctx {a.context // batch}")
            return
    long_prompt = prompts(0, 1, a.prefill)[0]
    one = SamplingParams(max_tokens=1, temperature=0.0)
    wall = profiled(lambda: llm.generate([long_prompt], one), a.profile, f"prefill {a.prefill}")
    print(f"prefill {a.prefill} tokens: {wall * 1e3:.0f} ms, {a.prefill / wall:.0f} tok/s")
    b1 = decode_steps(llm, prompts(1, 1, a.context), a.decode_steps, a.profile, f"decode b1 ctx {a.context}")
    print(f"decode b1 ctx {a.context}: {b1:.2f} ms/step, {1e3 / b1:.1f} tok/s")
    b8 = decode_steps(llm, prompts(2, 8, a.context // 4), a.decode_steps, a.profile, f"decode b8 ctx {a.context // 4}")
    print(f"decode b8 ctx {a.context // 4}: {b8:.2f} ms/step, {8e3 / b8:.1f} tok/s")


if __name__ == "__main__":
    main()
