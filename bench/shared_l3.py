"""Two `kvstrata serve` processes ("machines" A and B: own ports, own L1/L2) sharing one L3 store:
B's TTFT on a long prefix A computed, against B recomputing a prefix nobody has seen.

    .venv/bin/python bench/shared_l3.py --backend mooncake --prompt-tokens 2048 --reps 3

Starts a mooncake_master (or a redis-server) on a free loopback port and both servers (SmolLM2,
one thread each, `--kvstore-storage-backend` on it). Per rep, two fresh random token-id prompts
P and Q of the same length: A computes P (cold) and its pages reach L3; then B gets Q (cold:
recomputed) and P (its prefix from L3), interleaved. Reports the medians, the tokens B took from
the store (its `prefix_cache_hits_total{tier="store"}`) and the ratio.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from store_servers import mooncake_master, redis_server  # noqa: E402
from kvstrata.bench.kv.tiers_ttft import server, ttft  # noqa: E402


def metric(url: str, name: str) -> float:
    """The sum of a series' samples with tier="store"."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and s.labels.get("tier") == "store")


def store_hits(url: str) -> float:
    return metric(url, "kvstrata:prefix_cache_hits_total")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["mooncake", "redis"], default="mooncake")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--log-dir", default="bench/results/logs")
    ns = parser.parse_args()
    logs = Path(ns.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with ExitStack() as stack:
        if ns.backend == "mooncake":
            config = {"master_server_address": stack.enter_context(mooncake_master())}
        else:
            config = {"url": stack.enter_context(redis_server()).url}
        flags = ["--num-threads", "1", "--kvstore-storage-backend", ns.backend,
                 "--kvstore-storage-backend-extra-config", json.dumps(config)]
        a = stack.enter_context(server(flags, logs / "shared_l3-a.log", startup_timeout_s=1800))
        b = stack.enter_context(server(flags, logs / "shared_l3-b.log", startup_timeout_s=1800))
        recompute, from_l3, taken = [], [], []
        for _ in range(ns.reps):
            p, q = ([rng.randrange(300, 40000) for _ in range(ns.prompt_tokens)] for _ in range(2))
            written = metric(a, "kvstrata:kvstore_writes_total")
            ttft(a, p)
            while metric(a, "kvstrata:kvstore_writes_total") < written + ns.prompt_tokens // 16:
                time.sleep(0.1)  # until A's write-through (an I/O thread) has put P's pages in the store
            t_q, cached_q = ttft(b, q)
            before = store_hits(b)
            t_p, cached_p = ttft(b, p)
            recompute.append(t_q)
            from_l3.append(t_p)
            taken.append(store_hits(b) - before)
            print(f"B recompute {t_q * 1000:.0f} ms (cached {cached_q}); B from L3 {t_p * 1000:.0f} ms "
                  f"(cached {cached_p}, from the store {taken[-1]:.0f})", file=sys.stderr)
        r, s = statistics.median(recompute), statistics.median(from_l3)
        print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; backend {ns.backend}; "
              f"{ns.prompt_tokens}-token prompts; {ns.reps} reps")
        print("| B's prefix | TTFT p50 | x recomputing | tokens from the store |")
        print("|---|---|---|---|")
        print(f"| recomputed | {r * 1000:.0f} ms | 1 | 0 |")
        print(f"| from L3 ({ns.backend}, computed on A) | {s * 1000:.0f} ms | {s / r:.3f} "
              f"| {statistics.median(taken):.0f} per request |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
