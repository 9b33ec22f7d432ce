"""Agentic hit efficiency and rank balance through SGLang Model Gateway vs `kvstrata route`, one run.

    python bench/smg_vs_route.py [--rounds 2] [--sessions 8] [--turns 4] ...

Starts two `kvstrata serve` processes (SmolLM2, one thread each), `kvstrata route` and
`smg launch --policy cache_aware` in front of both, then runs the same `bench agentic` workload
through each gateway in turn (route, smg, route, smg, ...; both servers' caches flushed before
each run). Per run: hit efficiency (cached tokens / what one shared cache could have hit),
TTFT p50, and how many requests each server took (from its /metrics). Prints a markdown table;
every process it started is stopped at the end, on Ctrl-C and on SIGTERM too.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvstrata.bench.achievable import load_tokenizer
from kvstrata.bench.agentic.driver import run_agentic_workload
from kvstrata.bench.agentic.workload import AgenticConfig
from kvstrata.bench.args import default_tokenizer
from kvstrata.bench.kv.tiers_ttft import server
from kvstrata.process_tree import pdeathsig_preexec
from kvstrata.router.launcher import free_port


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, preexec_fn=pdeathsig_preexec)


def wait_ok(url: str, procs: list[subprocess.Popen[bytes]], path: str = "/health") -> None:
    while True:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process exited while waiting for {url}{path}")
        try:
            if httpx.get(url + path, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def requests_served(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "kvstrata:request_success_total")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=800)
    parser.add_argument("--turn-tokens", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--log-dir", default="bench/results/logs")
    ns = parser.parse_args()
    logs = Path(ns.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    smg = str(Path(sys.executable).with_name("smg"))

    def on_term(sig: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # unwinds to the finally below, which stops every process

    signal.signal(signal.SIGTERM, on_term)
    procs: list[subprocess.Popen[bytes]] = []
    stack = ExitStack()  # the two servers (bench.tiers_ttft.server: started, health-checked, SIGTERMed)
    try:
        servers = [stack.enter_context(server(["--num-threads", "1"], logs / f"smg_vs_route-{name}.log"))
                   for name in ("a", "b")]
        route_port, smg_port = free_port(), free_port()
        procs.append(start([sys.executable, "-m", "kvstrata.cli", "route", "--port", str(route_port), "--log-level",
                            "warning", *[a for u in servers for a in ("--worker", u)]], logs / "smg_vs_route-route.log"))
        procs.append(start([smg, "launch", "--host", "127.0.0.1", "--port", str(smg_port), "--worker-urls", *servers,
                            "--policy", "cache_aware", "--log-level", "warn", "--prometheus-host", "127.0.0.1",
                            "--prometheus-port", str(free_port())], logs / "smg_vs_route-smg.log"))
        gateways = {"kvstrata route": f"http://127.0.0.1:{route_port}", "smg cache_aware": f"http://127.0.0.1:{smg_port}"}
        wait_ok(gateways["kvstrata route"], procs)
        wait_ok(gateways["smg cache_aware"], procs, "/readiness")
        tokenizer = load_tokenizer(default_tokenizer())
        args = argparse.Namespace(model="smollm2", tokenizer=default_tokenizer(), max_tokens=ns.max_tokens,
                                  concurrency=ns.concurrency, request_rate=None, page_size=16)
        config = AgenticConfig(agents=ns.agents, sessions=ns.sessions, turns=ns.turns, system_tokens=ns.system_tokens,
                               turn_tokens=ns.turn_tokens, seed=0)
        rows = []
        for rnd in range(ns.rounds):
            for name, url in gateways.items():
                for backend in servers:
                    httpx.post(backend + "/flush_cache", timeout=30).raise_for_status()
                before = [requests_served(s) for s in servers]
                report = run_agentic_workload(args, url, config, tokenizer, progress=False)
                share = [requests_served(s) - b for s, b in zip(servers, before)]
                rows.append((rnd, name, report, share))
                print(f"round {rnd} {name}: hit efficiency {report['hit_efficiency']:.3f} per server {share}",
                      file=sys.stderr)
        print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {config}")
        print("| round | gateway | requests | errors | hit efficiency | cached / achievable tokens "
              "| TTFT p50 later turns (s) | requests on server A / B |")
        print("|---|---|---|---|---|---|---|---|")
        for rnd, name, r, share in rows:
            ttft = r["ttft_s"]["later_turns"]["p50"]
            print(f"| {rnd} | {name} | {r['requests']} | {r['errors']} | {r['hit_efficiency']:.3f} "
                  f"| {r['cached_tokens']:,} / {r['achievable_cached_tokens']:,} | {ttft:.2f} "
                  f"| {share[0]:.0f} / {share[1]:.0f} |")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        stack.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
