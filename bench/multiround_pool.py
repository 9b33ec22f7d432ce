"""Later rounds' TTFT pooled over several `kvstrata bench compare --workload multiround` reports, per engine:
one run's 32 later-round requests put a p90 or p99 on its 3rd or 1st largest value, which moved 20-40%
between runs of the same code on the Xeon; pooled, the percentiles rest on many runs' requests.

    python bench/multiround_pool.py bench/results/xeon/spec-1205d/multiround-run*.json

Prints, per engine, the number of later-round requests and their TTFT p50, mean, p90 and p99 (seconds,
linear interpolation between ranks).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

sys.path.insert(0, ".")
from kvstrata.bench.report import percentile  # noqa: E402  (linear interpolation between ranks)


def later_round_ttfts(paths: list[str]) -> dict[str, list[float]]:
    pooled: dict[str, list[float]] = {}
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for engine, result in report["engines"].items():
            pooled.setdefault(engine, []).extend(r["ttft_s"] for r in result["per_request"] if r["turn"] > 0)
    return pooled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="+", help="multiround compare JSON reports")
    for engine, xs in later_round_ttfts(ap.parse_args().reports).items():
        print(f"{engine}: {len(xs)} later-round requests, TTFT p50 {percentile(xs, 50):.3f} s, mean "
              f"{statistics.mean(xs):.3f}, p90 {percentile(xs, 90):.3f}, p99 {percentile(xs, 99):.3f}")


if __name__ == "__main__":
    main()
