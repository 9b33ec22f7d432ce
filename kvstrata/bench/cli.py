"""`kvstrata bench <workload>`: the load-client subcommands, registered from one table.

The main CLI calls `add_bench_parser(subparsers)`, which sets `func=run_bench` on `bench`. To add a
workload (throughput, repeat, compare, ...) give it a flag adder and a `run(args) -> int` in its
own module and add one `BenchCommand` row to `BENCH_COMMANDS`. The run function is named as
"module:function" and imported only when its command runs, so `kvstrata --help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Callable, NamedTuple

from kvstrata.bench.args import add_agentic_workload_args, add_client_arguments
from kvstrata.bench.compare import add_compare_args
from kvstrata.bench.multiround import add_multiround_args
from kvstrata.bench.repeat import add_repeat_args
from kvstrata.bench.soak import add_soak_args
from kvstrata.bench.throughput import add_throughput_args


class BenchCommand(NamedTuple):
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: str  # "module:function", the function taking the parsed args and returning the exit code


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
