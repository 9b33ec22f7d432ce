"""`kvstrata bench tiers-ttft`: TTFT of a long prompt prefix by where its KV comes from: computed, L1,
L2, L3 `file` after a restart, L3 Redis. Starts its own `kvstrata serve` processes (and a redis-server)
on free ports.

    kvstrata bench tiers-ttft --prompt-tokens 2048 --reps 3 --output bench/results/tiers-ttft.json

Per rep, a fresh random token-id prompt P (POST /v1/completions, streamed, max_tokens 4, greedy):
  computed  P cold                                  L1  P again
  L2        P after two fillers pushed it out of L1 (L1 = prompt + 25%, L2 = 2 x L1)
  L3 file   P on a new server process over the same store directory (a restart)
  L3 redis  P after POST /flush_cache (L1 and L2 emptied) on a server whose store is Redis
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from kvstrata.process_tree import pdeathsig_preexec
from kvstrata.serving.ports import free_port


@contextmanager
def server(extra: list[str], log: Path, startup_timeout_s: float = 300) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kvstrata.cli", "serve", "--port", str(port), "--log-level", "warning", *extra]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pdeathsig_preexec)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {' '.join(cmd)} (see {log})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # SIGTERM: in-flight L3 writes are drained
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ttft(url: str, ids: list[int]) -> tuple[float, int]:
    """(seconds to the first streamed token, cached prompt tokens)."""
    body = {"model": "smollm2", "prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    first, cached = None, -1
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if first is None and any(c.get("text") for c in chunk.get("choices") or []):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    assert first is not None, "no token streamed"
    return first, cached


def add_tiers_ttft_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)


def run_tiers_ttft(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    n = args.prompt_tokens
    prompts = [[rng.randrange(1000, 40000) for _ in range(n)] for _ in range(args.reps * 3)]
    work = Path(tempfile.mkdtemp(prefix="kvstrata-tiers-ttft-"))
    log = work / "servers.log"
    l1 = ["--max-total-tokens", str(n + n // 4)]
    file_store = ["--kvstore-storage-backend", "file", "--kvstore-storage-backend-extra-config",
                  json.dumps({"path": str(work / "kvstore")})]
    times: dict[str, list[float]] = {k: [] for k in ("computed", "L1", "L2", "L3 file (restart)", "L3 redis")}
    cached: dict[str, list[int]] = {k: [] for k in times}

    def record(kind: str, url: str, ids: list[int]) -> None:
        t, c = ttft(url, ids)
        times[kind].append(t)
        cached[kind].append(c)
        print(f"{kind:20s} ttft_s={t:.3f} cached_tokens={c}", file=sys.stderr)

    with server(l1 + file_store, log) as url:
        ttft(url, prompts[-1][:64])  # warm-up: the first forward pass pays one-time costs
        for r in range(args.reps):
            p, f1, f2 = prompts[3 * r : 3 * r + 3]
            record("computed", url, p)
            record("L1", url, p)
            ttft(url, f1)
            ttft(url, f2)
            record("L2", url, p)
    with server(l1 + file_store, log) as url:
        ttft(url, prompts[-1][:64])  # warm-up (a prompt of its own: nothing of P is touched)
        for r in range(args.reps):
            record("L3 file (restart)", url, prompts[3 * r])
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        redis_store = ["--kvstore-storage-backend", "redis", "--kvstore-storage-backend-extra-config",
                       json.dumps({"url": f"redis://127.0.0.1:{redis_port}/0"})]
        with server(l1 + redis_store, log) as url:
            ttft(url, prompts[-1][:64])
            for r in range(args.reps):
                ttft(url, prompts[3 * r])  # computed, written through to Redis
                time.sleep(1.0)  # let the write-through land
                httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
                record("L3 redis", url, prompts[3 * r])
    finally:
        redis.terminate()
        redis.wait()
    base = statistics.median(times["computed"])
    summary = {k: {"ttft_s_median": statistics.median(v), "ratio_to_computed": statistics.median(v) / base,
                   "cached_tokens": cached[k], "ttft_s": v} for k, v in times.items()}
    print(f"\nprompt_tokens={n} reps={args.reps} (median TTFT; ratio to recomputing)")
    for k, s in summary.items():
        print(f"  {k:20s} {s['ttft_s_median'] * 1000:8.1f} ms   x{s['ratio_to_computed']:.3f}   cached={s['cached_tokens']}")
    if args.output:
        Path(args.output).write_text(json.dumps({"prompt_tokens": n, "reps": args.reps, "results": summary}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0
