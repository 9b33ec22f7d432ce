"""`kvstrata bench multiround`: LMCache's multi-round QA against any OpenAI-compatible server.

The workload (multiround/workload.py) is driven by the agentic driver: each user is a session
whose next round is sent only after its previous answer arrived (and was appended to its
history); users take turns at the gate, so their rounds interleave. `--qps` (LMCache's name for
`--request-rate`) makes arrivals a seeded Poisson process; without it the load is closed-loop at
`--concurrency`. The report is the agentic one (report.py: cached / achievable tokens, hit
efficiency, TTFT, output tokens/s, errors) plus one row per round (TTFT p50/p99, hit efficiency).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import asdict
from typing import Any

from kvstrata.bench.args import add_client_arguments, check_client_arguments
from kvstrata.bench.multiround.workload import MultiRoundConfig, generate_multiround

DEFAULT_SYSTEM_TOKENS = 1000


def add_multiround_workload_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The workload's own flags; `--system-tokens` and the client flags are added by the caller."""
    group = parser.add_argument_group("multi-round QA workload")
    group.add_argument("--num-users", type=int, default=8,
                       help="users, each with its own history (default: %(default)s)")
    group.add_argument("--num-rounds", type=int, default=5, help="questions per user (default: %(default)s)")
    group.add_argument("--history-tokens", type=int, default=2000,
                       help="each user's starting context, sent with its first question (default: %(default)s)")
    group.add_argument("--question-tokens", type=int, default=20, help="tokens per question (default: %(default)s)")
    group.add_argument("--answer-tokens", type=int, default=100,
                       help="max_tokens of every answer; --max-tokens does not apply here (default: %(default)s)")
    group.add_argument("--qps", dest="request_rate", type=float, default=None, metavar="QPS",
                       help="Poisson arrivals per second, LMCache's name for --request-rate (default: off, "
                            "closed loop at --concurrency)")
    return group


def add_multiround_args(parser: argparse.ArgumentParser) -> None:
    """All flags of `bench multiround`."""
    group = add_multiround_workload_args(parser)
    group.add_argument("--system-tokens", type=int, default=DEFAULT_SYSTEM_TOKENS,
                        help="the system prompt all users share (default: %(default)s)")
    add_client_arguments(parser)


def multiround_config(args: argparse.Namespace) -> MultiRoundConfig:
    """The config the flags describe; raises ValueError naming a flag out of shape."""
    system = DEFAULT_SYSTEM_TOKENS if args.system_tokens is None else args.system_tokens
    config = MultiRoundConfig(num_users=args.num_users, num_rounds=args.num_rounds, system_tokens=system,
                              history_tokens=args.history_tokens, question_tokens=args.question_tokens,
                              answer_tokens=args.answer_tokens, seed=args.seed)
    config.validate()
    check_client_arguments(args)
    return config


def run_multiround_workload(args: argparse.Namespace, url: str, progress: bool = False) -> dict[str, Any]:
    """Drive the workload the flags describe against `url`; the report dict (the JSON file)."""
    from kvstrata.bench.achievable import load_tokenizer
    from kvstrata.bench.agentic.driver import RequestRecord, drive_agentic
    from kvstrata.bench.client import ChatClient
    from kvstrata.bench.report import build_report, per_turn

    config = multiround_config(args)
    workload = generate_multiround(config)
    concurrency = None if args.request_rate else args.concurrency

    async def run() -> list[RequestRecord]:
        connections = max(concurrency or 0, config.num_users)
        async with ChatClient(url, args.model, config.answer_tokens, max_connections=connections) as client:
            return await drive_agentic(workload, client, concurrency, args.request_rate, config.seed,
                                       progress=progress, desc="multiround")

    records = asyncio.run(run())
    meta = {"workload": "multiround", "url": url, "model": args.model, "max_tokens": config.answer_tokens,
            "concurrency": concurrency, "qps": args.request_rate, "page_size": args.page_size, **asdict(config)}
    report = build_report(records, load_tokenizer(args.tokenizer), args.page_size, meta)
    report["per_round"] = per_turn(report)
    return report


def format_rounds(report: dict[str, Any]) -> str:
    """One line per round: requests, errors, TTFT p50 / p99 in ms, hit efficiency."""
    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 1000:,.1f}"

    lines = [f"{'round':>5} {'requests':>8} {'errors':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'hit eff.':>8}"]
    for row in report["per_round"]:
        hit = "n/a" if row["hit_efficiency"] is None else f"{row['hit_efficiency']:.3f}"
        lines.append(f"{row['turn']:>5} {row['requests']:>8} {row['errors']:>6} {ms(row['ttft_p50_s']):>12} "
                     f"{ms(row['ttft_p99_s']):>12} {hit:>8}")
    return "\n".join(lines)


def run_multiround(args: argparse.Namespace) -> int:
    """The `bench multiround` command: generate, drive, report. Returns the process exit code."""
    from kvstrata.bench.achievable import load_tokenizer
    from kvstrata.bench.report import format_table, write_json

    try:
        config = multiround_config(args)
        load_tokenizer(args.tokenizer)  # before the run: a bad path fails fast
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rate = f"qps={args.request_rate}" if args.request_rate else f"concurrency={args.concurrency}"
    print(f"multiround: {config.num_users * config.num_rounds} requests ({config.num_users} users x "
          f"{config.num_rounds} rounds, {rate}) -> {args.url} model={args.model}", file=sys.stderr)
    report = run_multiround_workload(args, args.url, progress=True)
    print(format_table(report))
    print(format_rounds(report))
    if args.output:
        write_json(report, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    return 1 if report["errors"] else 0
