"""`kvstrata bench repeat`: repeated requests, the response cache's workload (docs/workloads.md, "Repeat").

A seeded stream of `--num-requests` /v1/completions requests: exactly a fraction `--repeat-ratio`
(at seeded random positions) drawn from a pool of `--hot-prompts` hot prompts (EnergonAI's river question first), the rest unique.
Every request is greedy with `ignore_eos`, so each one generates exactly `--max-tokens` tokens
and a unique request costs what a hot one costs on a miss. Load is closed-loop (`--concurrency`
requests in flight) or open-loop (`--request-rate`, Poisson). Run it once against a server with
the response cache off and once with it on; it reports mean, p50 and p99 end-to-end latency,
overall, for hot and unique requests apart and for cache hits and the rest (by the server's
`x-kvstrata-cache` header, so `--repeat-ratio 1 --hot-prompts 1` measures a hit's latency).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvstrata.bench.args import add_client_arguments

RIVER = "Question: What is the longest river on the earth? Answer:"
HOT_QUESTIONS = (
    RIVER,
    "Question: What is the highest mountain on the earth? Answer:",
    "Question: What is the largest ocean on the earth? Answer:",
    "Question: What is the biggest desert on the earth? Answer:",
    "Question: What is the deepest lake on the earth? Answer:",
    "Question: What is the largest country on the earth? Answer:",
    "Question: What is the coldest place on the earth? Answer:",
    "Question: What is the oldest city on the earth? Answer:",
)
_THINGS = ("river", "mountain", "island", "forest", "volcano", "glacier", "canyon", "waterfall", "city", "lake")
_PLACES = ("Europe", "Asia", "Africa", "the Americas", "Oceania", "the Arctic", "the Alps", "the Andes")


class RepeatRequest(NamedTuple):
    prompt: str
    hot: bool


@dataclass(frozen=True)
class RepeatResult:
    hot: bool
    latency_s: float
    cache: str  # the x-kvstrata-cache header ("" when the server sends none)
    error: str | None = None


def add_repeat_args(parser: argparse.ArgumentParser) -> None:
    add_repeat_workload_args(parser)
    add_client_arguments(parser)


def add_repeat_workload_args(parser: argparse.ArgumentParser) -> None:
    """The repeat workload's own flags (the client flags are added by the caller)."""
    group = parser.add_argument_group("repeat workload")
    group.add_argument("--repeat-ratio", type=float, default=0.5,
                       help="fraction of requests drawn from the hot pool, 0-1 (default: %(default)s)")
    group.add_argument("--hot-prompts", type=int, default=8, help="hot pool size, 1-8 (default: %(default)s)")
    group.add_argument("--num-requests", type=int, default=100, help="requests in the run (default: %(default)s)")


def repeat_requests(num_requests: int, repeat_ratio: float, hot_prompts: int, seed: int) -> list[RepeatRequest]:
    """The seeded request stream; unique prompts have the hot ones' shape and about their length."""
    if not 0.0 <= repeat_ratio <= 1.0:
        raise ValueError(f"--repeat-ratio must be between 0 and 1, got {repeat_ratio}")
    if not 1 <= hot_prompts <= len(HOT_QUESTIONS):
        raise ValueError(f"--hot-prompts must be between 1 and {len(HOT_QUESTIONS)}, got {hot_prompts}")
    if num_requests < 1:
        raise ValueError(f"--num-requests must be >= 1, got {num_requests}")
    rng = random.Random(f"kvstrata-repeat:{seed}")
    hot_positions = set(rng.sample(range(num_requests), round(repeat_ratio * num_requests)))  # exactly the ratio
    out = []
    for i in range(num_requests):
        if i in hot_positions:
            out.append(RepeatRequest(HOT_QUESTIONS[rng.randrange(hot_prompts)], True))
        else:
            thing, place = rng.choice(_THINGS), rng.choice(_PLACES)
            prompt = f"Question {seed}-{i}: Which {thing} in {place} is the most famous? Answer:"
            out.append(RepeatRequest(prompt, False))
    return out


async def drive_repeat(
    requests: list[RepeatRequest], url: str, model: str, max_tokens: int,
    concurrency: int | None, request_rate: float | None, seed: int,
) -> list[RepeatResult]:
    """Send every request (in order; open or closed loop) and time each one end to end."""
    import httpx

    endpoint = url.rstrip("/").removesuffix("/v1") + "/v1/completions"
    slots = asyncio.Semaphore(concurrency or len(requests))
    rng = random.Random(f"kvstrata-repeat:{seed}:arrivals")

    async def one(client: httpx.AsyncClient, req: RepeatRequest) -> RepeatResult:
        body = {"model": model, "prompt": req.prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        async with slots:
            t0 = time.perf_counter()
            try:
                resp = await client.post(endpoint, json=body)
                error = None if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:200]}"
                cache = resp.headers.get("x-kvstrata-cache", "")
            except httpx.HTTPError as exc:
                error, cache = f"{type(exc).__name__}: {exc}", ""
            return RepeatResult(req.hot, time.perf_counter() - t0, cache, error)

    limits = httpx.Limits(max_connections=concurrency or 256, max_keepalive_connections=concurrency or 256)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0), limits=limits) as client:
        tasks = []
        for req in requests:
            if request_rate:
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.create_task(one(client, req)))
        return list(await asyncio.gather(*tasks))


def summarize_repeat(results: list[RepeatResult], meta: dict[str, Any]) -> dict[str, Any]:
    from kvstrata.bench.report import percentile

    def latency(rows: list[RepeatResult]) -> dict[str, float | int | None]:
        xs = [r.latency_s * 1000.0 for r in rows if r.error is None]
        mean = sum(xs) / len(xs) if xs else None
        return {"requests": len(xs), "mean_ms": mean, "p50_ms": percentile(xs, 50), "p99_ms": percentile(xs, 99)}

    caches = [r.cache for r in results if r.error is None]
    return {
        **meta,
        "requests": len(results),
        "errors": sum(r.error is not None for r in results),
        "first_error": next((r.error for r in results if r.error), None),
        "cache_header": {k: caches.count(k) for k in sorted(set(caches))},
        "all": latency(results),
        "hot": latency([r for r in results if r.hot]),
        "unique": latency([r for r in results if not r.hot]),
        "cache_hit": latency([r for r in results if r.cache == "hit"]),  # by the server's x-kvstrata-cache
        "cache_miss": latency([r for r in results if r.cache != "hit"]),
    }


def format_repeat(summary: dict[str, Any]) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:,.1f}"

    lines = [f"{'requests':<10} {'n':>6} {'mean ms':>10} {'p50 ms':>10} {'p99 ms':>10}"]
    for name in ("all", "hot", "unique", "cache_hit", "cache_miss"):
        row = summary[name]
        cells = (ms(row["mean_ms"]), ms(row["p50_ms"]), ms(row["p99_ms"]))
        lines.append(f"{name:<10} {row['requests']:>6} " + " ".join(f"{c:>10}" for c in cells))
    lines.append(f"errors {summary['errors']}  x-kvstrata-cache {summary['cache_header']}")
    return "\n".join(lines)


def run_repeat_workload(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Drive the stream the flags describe against `url`; the summary dict. ValueError on bad flags."""
    requests = repeat_requests(args.num_requests, args.repeat_ratio, args.hot_prompts, args.seed)
    concurrency = None if args.request_rate else args.concurrency
    if args.request_rate is not None and args.request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 requests/s, got {args.request_rate}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    t0 = time.perf_counter()
    results = asyncio.run(
        drive_repeat(requests, url, args.model, args.max_tokens, concurrency, args.request_rate, args.seed)
    )
    meta = {
        "workload": "repeat", "url": url, "model": args.model, "max_tokens": args.max_tokens,
        "repeat_ratio": args.repeat_ratio, "hot_prompts": args.hot_prompts, "concurrency": concurrency,
        "request_rate": args.request_rate, "seed": args.seed, "wall_s": time.perf_counter() - t0,
    }
    return summarize_repeat(results, meta)


def run_repeat(args: argparse.Namespace) -> int:
    """The `bench repeat` command. Returns the process exit code (1 if any request failed)."""
    try:
        requests = repeat_requests(args.num_requests, args.repeat_ratio, args.hot_prompts, args.seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    hot = sum(r.hot for r in requests)
    print(f"repeat: {len(requests)} requests ({hot} hot) -> {args.url} model={args.model}", file=sys.stderr)
    try:
        summary = run_repeat_workload(args, args.url)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_repeat(summary))
    if args.output:
        from kvstrata.bench.report import write_json

        write_json(summary, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    return 1 if summary["errors"] else 0
