"""Cold prefill and decode tokens/s of any OpenAI-compatible server, measured over HTTP.

`bench compare` runs this probe against every engine through the same streaming client
(client.py), so the figures are comparable across engines (and include HTTP and detokenizing):
- cold prefill: a ~`prefill_tokens` system prompt led by a nonce (a unique run id, so no prefix
  cache or prompt cache can hold any of it), `max_tokens` 1: (prompt tokens - cached) / TTFT,
  the mean of `repeats` prompts sent one at a time;
- decode at batch 1 and batch `decode_batch`: that many streams at once, each a short unique
  prompt with `max_tokens` = `decode_tokens` and `ignore_eos`. The rate counts content chunks
  (scaled to the server's `completion_tokens`) that arrived in the window where every stream was
  decoding: after the last stream's first token, up to the first stream's last token. When the
  streams never overlapped (a server that queues them), the window is the whole run and
  `overlapped` is False.
A warm-up request goes first. Failed requests are counted, never raised.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, Sequence

from kvstrata.bench.args import check_ranges
from kvstrata.bench.client import ChatClient, ChatResult
from kvstrata.bench.text import prose


@dataclass(frozen=True)
class ProbeConfig:
    prefill_tokens: int = 2048
    decode_tokens: int = 128
    decode_batch: int = 8
    repeats: int = 2
    seed: int = 0
    context: int = 0  # positions every engine serves (`--context`); 0: the default slots of 4,096

    def validate(self) -> None:
        # a prompt, its decode tokens and the template's few must fit one slot (llama.cpp's are 4,096 by default)
        most = self.context - self.decode_tokens - 64 if self.context > 0 else 3800
        checks = [("--prefill-tokens", self.prefill_tokens, 64, most), ("--decode-tokens", self.decode_tokens, 8, 1024),
                  ("--decode-batch", self.decode_batch, 1, 64), ("--probe-repeats", self.repeats, 1, 10)]
        check_ranges(checks)


def _nonce(rng: random.Random) -> str:
    return f"Run {time.time_ns()}-{rng.randrange(10**9)}."


def prefill_messages(rng: random.Random, tokens: int) -> list[dict[str, str]]:
    """A unique-from-its-first-token prompt of about `tokens` tokens."""
    return [{"role": "system", "content": f"{_nonce(rng)} {prose(rng, tokens - 30)}"},
            {"role": "user", "content": "Summarize the text above in one sentence."}]


def decode_messages(rng: random.Random) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"{_nonce(rng)} {prose(rng, 40)}"},
            {"role": "user", "content": "Write a very long story about a river and the people who live near it."}]


def decode_rate(results: Sequence[ChatResult]) -> dict[str, Any]:
    """Aggregate decode tokens/s of streams sent together (see the module docstring)."""
    ok = [r for r in results if r.ok and len(r.chunk_times) >= 2]
    if not ok:
        return {"tokens_per_s": None, "overlapped": False, "window_s": None, "completion_tokens": 0, "chunks": 0}
    scale = [((r.completion_tokens or len(r.chunk_times)) / len(r.chunk_times)) for r in ok]
    start = max(r.chunk_times[0] for r in ok)
    end = min(r.chunk_times[-1] for r in ok)
    overlapped = end > start
    if not overlapped:  # streams served one after another: the whole run, tokens after each first
        start, end = min(r.chunk_times[0] for r in ok), max(r.chunk_times[-1] for r in ok)
        tokens = sum((len(r.chunk_times) - 1) * s for r, s in zip(ok, scale))
    else:
        tokens = sum(sum(start < t <= end for t in r.chunk_times) * s for r, s in zip(ok, scale))
    window = end - start
    return {"tokens_per_s": tokens / window if window > 0 else None, "overlapped": overlapped, "window_s": window,
            "completion_tokens": sum(r.completion_tokens or len(r.chunk_times) for r in ok),
            "chunks": sum(len(r.chunk_times) for r in ok)}  # fewer than tokens: the server sent several at once


def clients(url: str, model: str, config: ProbeConfig) -> tuple[ChatClient, ChatClient]:
    """The probe's two clients for one server: one-token replies (warm-up, prefill) and decode streams. A
    cold prompt may take a while: 10 minutes, or a second for every 10 of its tokens (a 32k prompt on a
    peer without fast kernels)."""
    timeout_s = max(600.0, config.prefill_tokens / 10)
    return (ChatClient(url, model, 1, max_connections=config.decode_batch, extra_body={"ignore_eos": True},
                       timeout_s=timeout_s),
            ChatClient(url, model, config.decode_tokens, max_connections=config.decode_batch,
                       extra_body={"ignore_eos": True}))


async def warm_once(one: ChatClient, rng: random.Random, failed: list[ChatResult]) -> None:
    """The warm-up request a probe sends a server first (its failure counted, never raised)."""
    warm = await one.chat(decode_messages(rng))
    failed += [warm] if not warm.ok else []


async def prefill_once(one: ChatClient, rng: random.Random, config: ProbeConfig,
                       failed: list[ChatResult]) -> dict[str, Any] | None:
    """One cold prompt of about `prefill_tokens`, alone: its prefill figures (None where it failed)."""
    r = await one.chat(prefill_messages(rng, config.prefill_tokens))
    if not r.ok:
        failed.append(r)
        return None
    seconds = r.ttft_s if r.ttft_s is not None else r.e2e_s
    computed = (r.prompt_tokens - (r.cached_tokens or 0)) if r.prompt_tokens is not None else None
    return {"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "prefill_s": seconds,
            "tokens_per_s": computed / seconds if computed is not None and seconds > 0 else None}


async def decode_once(many: ChatClient, rng: random.Random, batch: int, failed: list[ChatResult]) -> dict[str, Any]:
    """`batch` decode streams sent together: their aggregate rate (decode_rate)."""
    results = await asyncio.gather(*(many.chat(decode_messages(rng)) for _ in range(batch)))
    failed += [r for r in results if not r.ok]
    return decode_rate(results)


def batches(config: ProbeConfig) -> list[int]:
    return sorted({1, config.decode_batch})


def summary(prefill: list[dict[str, Any]], decode: dict[str, dict[str, Any]], failed: list[ChatResult],
            config: ProbeConfig) -> dict[str, Any]:
    """The probe's report from its measurements (`decode`: each batch's decode_rate)."""
    rates = [p["tokens_per_s"] for p in prefill if p["tokens_per_s"] is not None]
    return {
        "prefill_tokens_per_s": sum(rates) / len(rates) if rates else None,
        "prefill": prefill,
        "decode_tokens_per_s": {b: d["tokens_per_s"] for b, d in decode.items()},
        "decode": decode,
        "errors": len(failed),
        "first_error": failed[0].error if failed else None,
        "config": {"prefill_tokens": config.prefill_tokens, "decode_tokens": config.decode_tokens,
                   "decode_batch": config.decode_batch, "repeats": config.repeats},
    }


def probe_rng(config: ProbeConfig) -> random.Random:
    """The prompts' source: the same seed for every engine, so each is sent the same texts (new nonces)."""
    return random.Random(f"kvstrata-probe:{config.seed}")


async def _probe(url: str, model: str, config: ProbeConfig) -> dict[str, Any]:
    rng = probe_rng(config)
    failed: list[ChatResult] = []
    one_client, many_client = clients(url, model, config)
    async with one_client as one, many_client as many:
        await warm_once(one, rng, failed)
        prefill = [p for _ in range(config.repeats) if (p := await prefill_once(one, rng, config, failed)) is not None]
        decode = {str(b): await decode_once(many, rng, b, failed) for b in batches(config)}
    return summary(prefill, decode, failed, config)


def probe_throughput(url: str, model: str, config: ProbeConfig) -> dict[str, Any]:
    """Run the probe against `url`; the figures as a JSON-ready dict (None where not measured)."""
    config.validate()
    return asyncio.run(_probe(url, model, config))


def format_probe(result: dict[str, Any]) -> str:
    def cell(x: float | None) -> str:
        return "n/a" if x is None else f"{x:,.1f}"

    decode = " / ".join(f"b{b} {cell(v)}" for b, v in result["decode_tokens_per_s"].items())
    return (f"cold prefill tokens/s {cell(result['prefill_tokens_per_s'])}  decode tokens/s {decode}  "
            f"errors {result['errors']}")
