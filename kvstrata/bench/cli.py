"""`kvstrata bench <workload>`: the load-client subcommands, registered from one table.

The main CLI calls `add_bench_parser(subparsers)`, which sets `func=run_bench` on `bench`. To add a
workload (throughput, repeat, compare, ...) give it a flag adder and a `run(args) -> int` in its
own module and add one `BenchCommand` row to `BENCH_COMMANDS`. The run function is named as
"module:function" and imported only when its command runs, so `kvstrata --help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
from typing import Callable, NamedTuple

from kvstrata.bench.compare import add_compare_args
from kvstrata.bench.multiround import add_multiround_args
from kvstrata.bench.repeat import add_repeat_args
from kvstrata.bench.soak import add_soak_args
from kvstrata.bench.throughput import add_throughput_args
from kvstrata.bench.trace_cli import add_trace_args

DEFAULT_TOKENIZER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class BenchCommand(NamedTuple):
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: str  # "module:function", the function taking the parsed args and returning the exit code


def default_tokenizer() -> str:
    """The default model's GGUF under $KVSTRATA_HOME (default ~/.cache/kvstrata)."""
    home = Path(os.environ.get("KVSTRATA_HOME") or "~/.cache/kvstrata").expanduser()
    return str(home / DEFAULT_TOKENIZER_FILE)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags every workload shares: where to send, what to call the model, how to report."""
    group = parser.add_argument_group("client")
    group.add_argument("--url", default="http://127.0.0.1:8000",
                       help="base URL of any OpenAI-compatible server (default: %(default)s)")
    group.add_argument("--model", default="smollm2", help="model id sent in requests (default: %(default)s)")
    group.add_argument("--tokenizer", default=default_tokenizer(),
                       help="the served model's tokenizer for token accounting: a .gguf file or a "
                            "Hugging Face folder (default: %(default)s)")
    group.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default: %(default)s)")
    group.add_argument("--concurrency", type=int, default=4,
                       help="most requests in flight (default: %(default)s)")
    group.add_argument("--request-rate", type=float, default=None,
                       help="Poisson arrivals per second; overrides --concurrency (default: off)")
    group.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default: %(default)s)")
    group.add_argument("--page-size", type=int, default=16,
                       help="page size in tokens for achievable cached tokens (default: %(default)s)")
    group.add_argument("--output", default=None, help="write the summary as JSON to this file")


def check_client_arguments(args: argparse.Namespace) -> None:
    """Raise ValueError naming a client flag the drivers cannot work with (before any request)."""
    if args.request_rate is not None and args.request_rate <= 0:
        raise ValueError(f"--request-rate (--qps) must be > 0 requests/s (got {args.request_rate})")
    if args.request_rate is None and args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1 (got {args.concurrency})")
    if args.page_size < 1:
        raise ValueError(f"--page-size must be >= 1 (got {args.page_size})")


def add_agentic_workload_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The agentic workload's own flags (not --system-tokens, which multiround shares in `compare`)."""
    group = parser.add_argument_group("agentic workload")
    group.add_argument("--sessions", type=int, default=8, help="concurrent agent sessions, 1-64 (default: %(default)s)")
    group.add_argument("--turns", type=int, default=6, help="requests per session, 2-30 (default: %(default)s)")
    group.add_argument("--agents", type=int, default=1,
                       help="distinct system prompts; session s uses agent s %% agents (default: %(default)s)")
    group.add_argument("--turn-tokens", type=int, default=100,
                       help="tokens per user message or tool result, 20-200 (default: %(default)s)")
    return group


def _add_agentic(parser: argparse.ArgumentParser) -> None:
    group = add_agentic_workload_args(parser)
    group.add_argument("--system-tokens", type=int, default=1500,
                       help="system prompt + tool schemas size, 800-4000 (default: %(default)s)")
    add_client_arguments(parser)


BENCH_COMMANDS: tuple[BenchCommand, ...] = (
    BenchCommand("agentic", "interleaved multi-turn agent sessions with tool schemas", _add_agentic,
                 "kvstrata.bench.agentic:main"),
    BenchCommand("multiround", "LMCache's multi-round QA: users with a shared system prompt and their own history",
                 add_multiround_args, "kvstrata.bench.multiround:run_multiround"),
    BenchCommand("throughput", "offline cold prefill and decode tokens/s, kvstrata beside transformers",
                 add_throughput_args, "kvstrata.bench.throughput:run_throughput"),
    BenchCommand("repeat", "repeated requests (hot pool + unique) for the response cache, mean/p50/p99 latency",
                 add_repeat_args, "kvstrata.bench.repeat:run_repeat"),
    BenchCommand("soak", "production-shaped load for N minutes; fails on any error or RSS growth after warm-up",
                 add_soak_args, "kvstrata.bench.soak:run_soak"),
    BenchCommand("compare", "start each engine in turn (kvstrata, vllm, llamacpp), same workload and client, "
                 "then a throughput probe; JSON, Markdown table and PNG plots",
                 add_compare_args, "kvstrata.bench.compare:run_compare"),
    BenchCommand("trace", "replay a Mooncake FAST'25 trace (hash-id blocks as token ids) live, or --simulate "
                 "the L1/L2/L3 cache over it at given capacities", add_trace_args, "kvstrata.bench.trace_cli:run_trace"),
)


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `bench` and its workload subcommands on the main CLI's subparsers."""
    bench = subparsers.add_parser("bench", help="load-test any OpenAI-compatible server")
    bench.set_defaults(func=run_bench)
    workloads = bench.add_subparsers(dest="bench_command", metavar="WORKLOAD", required=True)
    for command in BENCH_COMMANDS:
        command.add_arguments(workloads.add_parser(command.name, help=command.help, description=command.help))


def run_bench(args: argparse.Namespace) -> int:
    """Dispatch a parsed `bench <workload>` command; returns the exit code."""
    command = next(c for c in BENCH_COMMANDS if c.name == args.bench_command)
    module, function = command.run.split(":")
    return int(getattr(importlib.import_module(module), function)(args))
