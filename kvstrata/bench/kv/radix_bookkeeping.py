"""`kvstrata bench radix-bookkeeping`: the L1 prefix-cache bookkeeping per request (no model, no KV copies).

    kvstrata bench radix-bookkeeping [--requests 2000] [--cached-pages 10000] [--prompt-tokens 4096]

The one bench command that times a kv/ data structure in-process rather than a server or the
offline `LLM` API (the layer order lets bench import kv; it still touches no engine internals).

A request is timed through what the scheduler does around the model:
    admit:  match -> lock -> hash the unmatched suffix (L2/L3 keys) -> evict if short -> alloc
    finish: insert -> free duplicates -> unlock
The cache starts with `--cached-pages` pages and stays near that size (the pool is just big
enough, so most admissions evict). Prompts: 40% repeat a cached prompt, 40% share a cached
prefix of random length and then diverge, 20% share only a 1k-token system prompt.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict

VOCAB = 50_000
SYSTEM_TOKENS = 1024


def make_prompt(rng: random.Random, cached: list[list[int]], systems: list[list[int]], length: int) -> list[int]:
    kind = rng.random()
    if cached and kind < 0.4:
        return list(rng.choice(cached))
    if cached and kind < 0.8:
        base = rng.choice(cached)
        keep = rng.randrange(SYSTEM_TOKENS, length)
    else:
        base, keep = rng.choice(systems), SYSTEM_TOKENS
    return base[:keep] + [rng.randrange(VOCAB) for _ in range(length - keep)]


def run(
    requests: int, cached_pages: int, page_size: int, prompt_tokens: int, seed: int, cpu_clock: bool = True
) -> dict[str, list[float]]:
    import torch  # here, not at the top: `kvstrata --help` imports this module

    from kvstrata.kv.hashing import hash_pages, namespace_root
    from kvstrata.kv.pool import PagePool
    from kvstrata.kv.radix import RadixPrefixCache

    rng = random.Random(seed)
    pages_per_prompt = -(-prompt_tokens // page_size)
    pool = PagePool(cached_pages + pages_per_prompt, page_size, 1, 1, 1, torch.float16)
    root = namespace_root("bench/model", "float16", page_size, "nhd")
    cache = RadixPrefixCache(pool, page_size, root)
    systems = [[rng.randrange(VOCAB) for _ in range(SYSTEM_TOKENS)] for _ in range(8)]
    cached: list[list[int]] = []
    while cache.num_cached_pages + pages_per_prompt <= cached_pages:
        prompt = make_prompt(rng, cached, systems, prompt_tokens)
        m = cache.match(prompt)
        new = pool.alloc(pages_per_prompt - len(m.pages))
        assert new is not None
        pool.free(cache.insert(prompt, m.pages + new))
        pool.free(new[len(prompt) // page_size - len(m.pages) :])  # partial last page
        cached.append(prompt)

    times: dict[str, list[float]] = defaultdict(list)
    # Thread CPU time by default: on a shared box, wall time mostly measures other processes.
    clock = time.thread_time_ns if cpu_clock else time.perf_counter_ns
    for _ in range(requests):
        prompt = make_prompt(rng, cached, systems, prompt_tokens)
        t0 = clock()
        m = cache.match(prompt)
        t1 = clock()
        cache.lock(m.node)
        t2 = clock()
        hash_pages(prompt[m.num_tokens :], page_size, root, parent=m.hashes[-1] if m.hashes else None)
        t3 = clock()
        need = pages_per_prompt - len(m.pages)
        if need > pool.num_free:
            cache.evict(need - pool.num_free)
        new = pool.alloc(need)
        assert new is not None
        t4 = clock()
        dups = cache.insert(prompt, m.pages + new)
        t5 = clock()
        pool.free(dups + new[len(prompt) // page_size - len(m.pages) :])
        cache.unlock(m.node)
        t6 = clock()
        for name, ns in [("match", t1 - t0), ("lock+unlock", t2 - t1 + t6 - t5), ("hash suffix", t3 - t2),
                         ("evict+alloc", t4 - t3), ("insert", t5 - t4), ("total", t6 - t0)]:
            times[name].append(ns / 1000)
        times["hit pages"].append(len(m.pages))
        cached[rng.randrange(len(cached))] = prompt
    cache.check_integrity()
    return times


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


def add_radix_bookkeeping_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cached-pages", type=int, default=10_000)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wall", action="store_true", help="time with the wall clock, not thread CPU time")


def check_args(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run (None when they can): prompts share a SYSTEM_TOKENS-token system prompt."""
    if args.prompt_tokens <= SYSTEM_TOKENS:
        return f"--prompt-tokens must be > {SYSTEM_TOKENS}, the shared system prompt (got {args.prompt_tokens})"
    for flag, value in (("--requests", args.requests), ("--cached-pages", args.cached_pages),
                        ("--page-size", args.page_size)):
        if value < 1:
            return f"{flag} must be >= 1 (got {value})"
    return None


def run_radix_bookkeeping(args: argparse.Namespace) -> int:
    from kvstrata.kv.hashing import hash_pages, namespace_root

    problem = check_args(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    clock = time.perf_counter_ns if args.wall else time.thread_time_ns
    prompt = list(range(args.prompt_tokens))
    root = namespace_root("bench/model", "float16", args.page_size, "nhd")
    reps = 200
    t0 = clock()
    for _ in range(reps):
        hash_pages(prompt, args.page_size, root)
    hash_us = (clock() - t0) / reps / 1000
    print(f"hash_pages {args.prompt_tokens} tokens page_size={args.page_size}: {hash_us:.0f} us")

    times = run(args.requests, args.cached_pages, args.page_size, args.prompt_tokens, args.seed, not args.wall)
    hits = times.pop("hit pages")
    print(f"{args.requests} requests x {args.prompt_tokens} tokens, cache ~{args.cached_pages} pages, "
          f"mean hit {statistics.mean(hits) * args.page_size / args.prompt_tokens:.0%} of tokens, "
          f"{'wall' if args.wall else 'thread CPU'} time")
    for name, xs in times.items():
        print(f"  {name:12s} mean {statistics.mean(xs):7.1f} us   p99 {p99(xs):7.1f} us")
    return 0
