"""`kvstrata bench soak` against the tiny model for a few seconds: no failed request, RSS sampled.

The real soak (2 minutes in CI: `make soak`; 10 for the reported figure) checks RSS flatness;
this test checks the command's load mix and report, since a pytest process's RSS is not flat.
"""
from __future__ import annotations

import asyncio
import os
import time

from kvstrata.cli import build_parser
from kvstrata.bench.soak import _load, summarize
from kvstrata.engine.async_engine import AsyncEngine
from serving_support import make_state, serve


def test_soak_load_mix_fails_nothing(engine: AsyncEngine) -> None:
    with serve(make_state(engine)) as srv:
        args = build_parser().parse_args(
            ["bench", "soak", "--url", srv.base_url, "--server-pid", str(os.getpid()), "--minutes", "0.05",
             "--concurrency", "4", "--max-tokens", "8", "--sample-s", "0.5"]
        )
        statuses, samples = asyncio.run(_load(srv.base_url, args, time.monotonic() + args.minutes * 60, os.getpid()))
    report = summarize(statuses, samples, args)
    assert report["failed"] == 0, report["statuses"]
    assert statuses[200] >= 10 and statuses[499] >= 1 and statuses[408] >= 1, statuses  # the mix ran
    assert len(samples) >= 4 and all(rss > 0 for _, rss in samples)
