"""`kvstrata bench compare`: the same workload through the same client against each engine in turn.

For each engine of `--engines` (kvstrata, vllm, llamacpp; engines.py): start its server on the
same model, wait for /health, run the workload (the `bench agentic` driver and report), stop it.
Then write `<out-dir>/<workload>-<date>.json` (every engine's full report), `.md` (a table) and
PNG plots (compare_plots.py). Only the agentic workload is wired so far.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvstrata.bench.engines import ENGINES, EngineUnavailable, RunningServer

WORKLOADS = ("agentic",)


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    from kvstrata.bench.cli import _add_agentic

    group = parser.add_argument_group("compare")
    group.add_argument("--workload", default="agentic", choices=WORKLOADS, help="workload to run (default: %(default)s)")
    group.add_argument("--engines", default="kvstrata,vllm",
                       help=f"comma-separated, run in this order; of {', '.join(ENGINES)} (default: %(default)s)")
    group.add_argument("--port", type=int, default=8300, help="port each engine serves on, in turn (default: %(default)s)")
    group.add_argument("--out-dir", default="bench/results", help="where the JSON, table and plots go (default: %(default)s)")
    group.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    _add_agentic(parser)


def _run_workload(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from kvstrata.bench.agentic import drive_agentic
    from kvstrata.bench.client import ChatClient
    from kvstrata.bench.report import build_report, load_tokenizer
    from kvstrata.bench.workloads import AgenticConfig, generate_agentic

    config = AgenticConfig(agents=args.agents, sessions=args.sessions, turns=args.turns,
                           system_tokens=args.system_tokens, turn_tokens=args.turn_tokens, seed=args.seed)
    workload = generate_agentic(config)
    concurrency = None if args.request_rate else args.concurrency

    async def run() -> list[Any]:
        connections = max(concurrency or 0, config.sessions)
        async with ChatClient(url, args.model, args.max_tokens, max_connections=connections) as client:
            return await drive_agentic(workload, client, concurrency, args.request_rate, config.seed, progress=False)

    records = asyncio.run(run())
    meta = {"workload": "agentic", "url": url, "model": args.model, "max_tokens": args.max_tokens,
            "concurrency": concurrency, "request_rate": args.request_rate, "page_size": args.page_size,
            **asdict(config)}
    return build_report(records, load_tokenizer(args.tokenizer), args.page_size, meta)


def run_compare(args: argparse.Namespace) -> int:
    from kvstrata.bench.report import format_table, load_tokenizer

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        print(f"error: unknown engine(s) {', '.join(unknown)}; choose from {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    load_tokenizer(args.tokenizer)  # a bad path fails before any server starts
    out_dir = Path(args.out_dir)
    stem = f"{args.workload}-{datetime.now(timezone.utc):%Y-%m-%d}"
    results: dict[str, Any] = {}
    for name in engines:
        print(f"compare: starting {name} on port {args.port}", file=sys.stderr)
        try:
            with RunningServer(ENGINES[name], args.port, args.tokenizer, out_dir / "logs" / f"{stem}-{name}.log") as srv:
                startup_s = srv.wait_healthy()
                print(f"compare: {name} ready after {startup_s:.0f} s; running {args.workload}", file=sys.stderr)
                started = time.monotonic()
                report = _run_workload(args, srv.url)
                report["meta"].update(engine=name, startup_s=startup_s, wall_s=time.monotonic() - started)
        except EngineUnavailable as exc:
            print(f"compare: skipping {name}: {exc}", file=sys.stderr)
            results[name] = {"error": str(exc)}
            continue
        print(f"--- {name}\n{format_table(report)}", file=sys.stderr)
        results[name] = report
    from kvstrata.bench.compare_plots import markdown_table, write_plots

    argv = sys.argv[3:] if sys.argv[1:3] == ["bench", "compare"] else []  # as typed, when run from the shell
    command = " ".join(["kvstrata bench compare", *argv])
    summary = {"workload": args.workload, "date": stem.split("-", 1)[1], "command": command, "engines": results}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = markdown_table(results)
    (out_dir / f"{stem}.md").write_text(f"`{command}`\n\n{table}\n")
    print(table)
    if not args.no_plots:
        for path in write_plots(results, out_dir, stem):
            print(f"wrote {path}", file=sys.stderr)
    print(f"wrote {out_dir / (stem + '.json')} and {out_dir / (stem + '.md')}", file=sys.stderr)
    return 0 if all("error" not in r and not r["errors"] for r in results.values()) else 1
