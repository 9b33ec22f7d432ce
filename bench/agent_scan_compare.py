"""docs/kv-tiers.md "Scan resistance", the live table: agent hit efficiency under a scan, per eviction policy and hints.

For each configuration, in turn (interleaved in one run, the same machine), start
`kvstrata serve --dtype float32 --max-total-tokens 2048 --kvstore-ratio 1 --eviction-policy P` on a
free port, run `kvstrata bench agentic` against it (with or without the scan and the hints), stop
it. Prints one row per run and writes bench/results/agent_scan.json.

    python bench/agent_scan_compare.py [--repeats 1] [--scan-prompts 40] [--scan-tokens 1600]
        [--think-time 8] [--turns 4] [--turn-tokens 60] [--max-tokens 32] [--no-baseline]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvstrata.bench.kv.tiers_ttft import server  # the same `kvstrata serve` on a free port, stopped by SIGTERM

SERVE = ["--dtype", "float32", "--max-total-tokens", "2048", "--kvstore-ratio", "1"]
AGENTIC = ["--sessions", "3", "--agents", "1", "--system-tokens", "800", "--concurrency", "3"]


def bench(policy: str, extra: list[str], out: Path, shape: list[str]) -> dict:
    with server([*SERVE, "--eviction-policy", policy], out.with_suffix(".log")) as url:
        cmd = [sys.executable, "-m", "kvstrata.cli", "bench", "agentic", "--url", url, *AGENTIC, *shape, *extra,
               "--output", str(out)]
        subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scan-prompts", type=int, default=40)
    ap.add_argument("--scan-tokens", type=int, default=1600)
    ap.add_argument("--think-time", type=float, default=8.0)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=60)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-baseline", action="store_true", help="skip the runs without a scan")
    a = ap.parse_args()
    scan = ["--scan-prompts", str(a.scan_prompts), "--scan-tokens", str(a.scan_tokens), "--think-time", str(a.think_time)]
    shape = ["--turns", str(a.turns), "--turn-tokens", str(a.turn_tokens), "--max-tokens", str(a.max_tokens)]
    runs = [("scan", "lru", scan), ("scan+hints", "lru", [*scan, "--cache-hints"]),
            ("scan", "slru", scan), ("scan+hints", "slru", [*scan, "--cache-hints"])]
    if not a.no_baseline:
        runs += [("no scan", "lru", []), ("no scan", "slru", [])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for name, policy, extra in runs:
                r = bench(policy, extra, Path(tmp) / "r.json", shape)
                row = {"run": name, "policy": policy, "repeat": rep, "hit_efficiency": r.get("hit_efficiency"),
                       "ttft_later_turns": (r.get("ttft_s") or {}).get("later_turns"), "errors": r.get("errors"),
                       "scan": r.get("scan"), "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    Path("bench/results/agent_scan.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
