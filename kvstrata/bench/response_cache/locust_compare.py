"""`kvstrata bench locust` (`make bench-locust` installs locust first): EnergonAI's Locust test
(locust/locustfile.py beside this module, package data) with the response cache off, then on.

For each run it starts `kvstrata serve` on --port (its own process, stopped after the run), waits
for GET /health, runs Locust headless for --run-time with --users users, and reads Locust's
aggregated CSV row. Prints one line per run: requests, failures, P50, P99 and mean in ms.
Locust rounds its percentiles (to the ms below 100 ms, to 2-3 significant digits above).
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kvstrata serve exited with {proc.returncode}; see its log")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"{url} was not healthy after {timeout_s:.0f}s")


def aggregated(stats_csv: Path) -> dict[str, str]:
    with stats_csv.open() as f:
        return next(row for row in csv.DictReader(f) if row["Name"] == "Aggregated")


def run_once(name: str, cache_size: int, args: argparse.Namespace, out: Path) -> dict[str, str]:
    url = f"http://127.0.0.1:{args.port}"
    serve = [str(BIN / "kvstrata"), "serve", "--port", str(args.port), "--response-cache-size", str(cache_size),
             *args.serve_args.split()]
    with (out / f"{name}-server.log").open("wb") as log:
        server = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, server)
            locust = [str(BIN / "locust"), "-f", str(HERE / "locust" / "locustfile.py"), "--headless",
                      "-u", str(args.users), "-r", str(args.users), "-t", args.run_time, "--host", url,
                      "--csv", str(out / name), "--only-summary"]
            with (out / f"{name}-locust.log").open("wb") as llog:
                subprocess.run(locust, stdout=llog, stderr=subprocess.STDOUT, check=False)
            stats = httpx.get(f"{url}/response_cache", timeout=5).json()
        finally:
            server.terminate()
            server.wait(timeout=30)
    row = aggregated(out / f"{name}_stats.csv")
    row["cache"] = f"hits={stats['hits']} misses={stats['misses']}"
    return row


def add_locust_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--users", type=int, default=4, help="concurrent Locust users (default: %(default)s)")
    parser.add_argument("--run-time", default="60s", help="Locust run time per run (default: %(default)s)")
    parser.add_argument("--cache-size", type=int, default=64, help="--response-cache-size of the 'on' run")
    parser.add_argument("--serve-args", default="", help="extra `kvstrata serve` flags for both runs")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "kvstrata-locust"),
                        help="folder for Locust's CSVs and the logs (default: %(default)s)")


def run_locust(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {name: run_once(name, size, args, out) for name, size in (("off", 0), ("on", args.cache_size))}
    print(f"{'cache':<6} {'requests':>9} {'failures':>9} {'P50 ms':>8} {'P99 ms':>8} {'mean ms':>9}  response cache")
    for name, row in rows.items():
        print(f"{name:<6} {row['Request Count']:>9} {row['Failure Count']:>9} {row['50%']:>8} {row['99%']:>8} "
              f"{float(row['Average Response Time']):>9.1f}  {row['cache']}")
    return 0
