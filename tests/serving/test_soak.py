"""`kvstrata bench soak` against the tiny model for a few seconds: no failed request, RSS sampled.

The real soak (2 minutes in CI: `make soak`; 10 for the reported figure) checks RSS flatness;
this test checks the command's load mix and report, since a pytest process's RSS is not flat.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from typing import Any

from kvstrata.cli import build_parser
from kvstrata.bench.soak import _load, summarize
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import make_state, serve

ROUNDS = 20


def _mix_ran(statuses: Counter[Any]) -> bool:
    return statuses[200] >= 10 and statuses[499] >= 1 and statuses[408] >= 1


def test_soak_load_mix_fails_nothing(engine: AsyncEngine) -> None:
    """Rounds of 3 s until the mix has run (answers, dropped streams, timeouts): on two busy cores one
    round may be too short for a seeded timeout request to come up, so progress is counted, not time."""
    statuses: Counter[Any] = Counter()
    samples: list[list[float]] = []
    with serve(make_state(engine)) as srv:
        for seed in range(ROUNDS):
            args = build_parser().parse_args(
                ["bench", "soak", "--url", srv.base_url, "--server-pid", str(os.getpid()), "--minutes", "0.05",
                 "--concurrency", "4", "--max-tokens", "8", "--sample-s", "0.5", "--seed", str(seed)]
            )
            got, sampled = asyncio.run(_load(srv.base_url, args, time.monotonic() + args.minutes * 60, os.getpid()))
            statuses.update(got)
            samples += sampled
            if _mix_ran(statuses):
                break
    report = summarize(statuses, samples, args)
    assert report["failed"] == 0, report["statuses"]
    assert _mix_ran(statuses), statuses
    assert len(samples) >= 4 and all(rss > 0 for _, rss in samples)
