"""`kvstrata bench soak`: hours of production-shaped load in minutes; the server's RSS must stay flat.

Without `--url` it starts `kvstrata serve --model MODEL` itself on a free port (extra server flags
after `--server-args`). `--concurrency` clients send, in a seeded mix: completions and chats on
a few shared system prompts (prefix cache), exact repeats (response cache), streams dropped at a
random point (aborts) and requests with a short `timeout` (408s). RSS of the server process
(`/proc/PID/status` VmRSS) is sampled every `--sample-s`; the first `--warmup-frac` of the run is
warm-up. It passes (exit 0) when no request failed (a 5xx, a transport error or an unexpected
4xx) and the RSS after warm-up stays within `--rss-tolerance` of its first post-warm-up sample.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shlex
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx  # imported where used, so `kvstrata --help` stays fast

log = logging.getLogger(__name__)
SYSTEMS = tuple(f"You are assistant #{i}. Follow the house style guide, section {i}, strictly. " * 4 for i in range(4))
EXPECTED = {200, 408, 499}  # 499: a stream this client dropped on purpose


def add_soak_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("soak")
    g.add_argument("--minutes", type=float, default=2.0, help="how long to run (default: %(default)s)")
    g.add_argument("--url", default=None, help="soak this server (default: start one with --model)")
    g.add_argument("--server-pid", type=int, default=None, help="with --url: the server's pid, to read its RSS")
    g.add_argument("--model", default="smollm2", help="model for the server it starts (default: %(default)s)")
    g.add_argument("--server-args", default="", help="extra `kvstrata serve` flags, one string")
    g.add_argument("--concurrency", type=int, default=8, help="clients at once (default: %(default)s)")
    g.add_argument("--max-tokens", type=int, default=16, help="max_tokens per request (default: %(default)s)")
    g.add_argument("--sample-s", type=float, default=2.0, help="seconds between RSS samples (default: %(default)s)")
    g.add_argument("--warmup-frac", type=float, default=0.3, help="share of the run that is warm-up")
    g.add_argument("--rss-tolerance", type=float, default=0.05, help="allowed RSS growth after warm-up")
    g.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
    g.add_argument("--output", default=None, help="write the summary as JSON to this file")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _request(client: httpx.AsyncClient, rng: random.Random, max_tokens: int) -> int:
    """One request of the mix; returns its status (499 for a stream dropped on purpose)."""
    kind = rng.choice(("chat", "completion", "repeat", "drop", "timeout"))
    system = rng.choice(SYSTEMS)
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0 if kind == "repeat" else 0.8}
    if kind == "chat":
        body["messages"] = [{"role": "system", "content": system},
                            {"role": "user", "content": f"question {rng.randint(0, 10**6)}"}]
        path = "/v1/chat/completions"
    else:
        suffix = "the usual question" if kind == "repeat" else f"question {rng.randint(0, 10**6)}"
        body["prompt"], path = system + suffix, "/v1/completions"
    if kind == "timeout":
        body.update(timeout=0.05, max_tokens=max(max_tokens, 256), ignore_eos=True)
    if kind != "drop":
        return (await client.post(path, json=body)).status_code
    async with client.stream("POST", path, json={**body, "stream": True, "ignore_eos": True}) as resp:
        keep = rng.randint(1, max(1, max_tokens // 2))
        async for line in resp.aiter_lines():
            keep -= line.startswith("data: ")
            if keep <= 0:
                return 499
        return resp.status_code


async def _load(url: str, args: argparse.Namespace, until: float, pid: int) -> tuple[Counter[Any], list[list[float]]]:
    import httpx

    statuses: Counter[Any] = Counter()
    samples: list[list[float]] = []
    start = time.monotonic()

    async def client_loop(worker: int) -> None:
        rng = random.Random(args.seed * 1000 + worker)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while time.monotonic() < until:
                try:
                    statuses[await _request(client, rng, args.max_tokens)] += 1
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1

    async def sampler() -> None:
        while time.monotonic() < until:
            samples.append([round(time.monotonic() - start, 1), rss_bytes(pid)])
            await asyncio.sleep(args.sample_s)

    await asyncio.gather(sampler(), *(client_loop(w) for w in range(args.concurrency)))
    return statuses, samples


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "kvstrata.cli", "serve", "--model", args.model, "--port", str(port),
           "--log-level", "warning", *shlex.split(args.server_args)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not become ready: {' '.join(cmd)}")


def summarize(statuses: Counter[Any], samples: list[list[float]], args: argparse.Namespace) -> dict[str, Any]:
    cut = args.warmup_frac * args.minutes * 60
    after = [rss for t, rss in samples if t >= cut] or [rss for _, rss in samples[-1:]]
    growth = (max(after) - after[0]) / after[0] if after else 0.0
    failed = sum(n for status, n in statuses.items() if status not in EXPECTED)
    return {
        "minutes": args.minutes, "requests": sum(statuses.values()), "failed": failed,
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "rss_mb_after_warmup_first": round(after[0] / 2**20, 1) if after else None,
        "rss_mb_after_warmup_max": round(max(after) / 2**20, 1) if after else None,
        "rss_growth": round(growth, 4), "rss_tolerance": args.rss_tolerance,
        "ok": failed == 0 and growth <= args.rss_tolerance and sum(statuses.values()) > 0,
        "rss_samples": samples,
    }


def run_soak(args: argparse.Namespace) -> int:
    proc = None
    url, pid = args.url, args.server_pid
    if url is None:
        proc, url = _start_server(args)
        pid = proc.pid
    if pid is None:
        raise SystemExit("--url needs --server-pid to read the server's RSS")
    try:
        until = time.monotonic() + args.minutes * 60
        statuses, samples = asyncio.run(_load(url, args, until, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    report = summarize(statuses, samples, args)
    text = json.dumps({k: v for k, v in report.items() if k != "rss_samples"}, indent=2)
    print(text)  # the command's output is its report
    if args.output:
        from kvstrata.bench.machine import with_machine

        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(with_machine(report), f, indent=2)
    if proc is not None and proc.returncode != 0:
        log.error("soak_server_exit code=%s (expected 0 after SIGTERM)", proc.returncode)
        return 1
    return 0 if report["ok"] else 1

