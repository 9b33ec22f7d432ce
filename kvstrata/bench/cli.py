"""`kvstrata bench <command>`: every benchmark, registered from one table.

The main CLI calls `add_bench_parser(subparsers)`, which sets `func=run_bench` on `bench`. To add a
benchmark (a workload, a probe, ...) give it a flag adder and a `run(args) -> int` in its family's
package (or a module of its own) and add one `BenchCommand` row to `BENCH_COMMANDS`. The run function
is named as "module:function" and imported only when its command runs, so `kvstrata --help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Callable, NamedTuple

from kvstrata.bench.agents.command import add_agents_args
from kvstrata.bench.args import add_agentic_workload_args, add_client_arguments
from kvstrata.bench.bf16_drift import add_bf16_drift_args
from kvstrata.bench.compare.command import add_compare_args
from kvstrata.bench.fleet.command import add_fleet_args
from kvstrata.bench.kv.radix_bookkeeping import add_radix_bookkeeping_args
from kvstrata.bench.kv.tiers_ttft import add_tiers_ttft_args
from kvstrata.bench.multiround.command import add_multiround_args
from kvstrata.bench.perplexity.command import add_perplexity_args
from kvstrata.bench.response_cache.locust_compare import add_locust_args
from kvstrata.bench.response_cache.repeat import add_repeat_args
from kvstrata.bench.soak import add_soak_args
from kvstrata.bench.spec.command import add_spec_args
from kvstrata.bench.synth.command import add_synth_model_args
from kvstrata.bench.throughput.offline import add_throughput_args
from kvstrata.bench.trace.command import add_trace_args


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
                 "kvstrata.bench.agentic.driver:main"),
    BenchCommand("agents", "the real agent CLIs (Claude Code, Codex; `make agent-deps`) headless against each engine: "
                 "per-turn TTFT, cached share, a new session, a restart over the file L3", add_agents_args,
                 "kvstrata.bench.agents.command:run_agents"),
    BenchCommand("fleet", "agent sessions sharing one long prefix behind `serve --dp-size N`, once per routing policy: "
                 "per-rank share, hit efficiency, first/later-turn TTFT", add_fleet_args, "kvstrata.bench.fleet.command:run_fleet"),
    BenchCommand("multiround", "LMCache's multi-round QA: users with a shared system prompt and their own history",
                 add_multiround_args, "kvstrata.bench.multiround.command:run_multiround"),
    BenchCommand("throughput", "offline cold prefill and decode tokens/s, kvstrata beside transformers",
                 add_throughput_args, "kvstrata.bench.throughput.offline:run_throughput"),
    BenchCommand("repeat", "repeated requests (hot pool + unique) for the response cache, mean/p50/p99 latency",
                 add_repeat_args, "kvstrata.bench.response_cache.repeat:run_repeat"),
    BenchCommand("soak", "production-shaped load for N minutes; fails on any error or RSS growth after warm-up",
                 add_soak_args, "kvstrata.bench.soak:run_soak"),
    BenchCommand("compare", "start each engine in turn (kvstrata, vllm, llamacpp and their variants: --engines), "
                 "same workload (agentic, multiround, repeat, throughput, edit, trace) and client, "
                 "then a throughput probe; JSON, Markdown table and PNG plots",
                 add_compare_args, "kvstrata.bench.compare.command:run_compare"),
    BenchCommand("tiers-ttft", "TTFT of a 2k-token prompt whose prefix comes from each tier (computed, L1, L2, "
                 "L3 file after a restart, L3 redis); starts its own servers", add_tiers_ttft_args,
                 "kvstrata.bench.kv.tiers_ttft:run_tiers_ttft"),
    BenchCommand("locust", "EnergonAI's Locust test, response cache off then on (needs `pip install locust`; "
                 "`make bench-locust`)", add_locust_args, "kvstrata.bench.response_cache.locust_compare:run_locust"),
    BenchCommand("bf16-drift", "offline: how often bf16 greedy output differs from float32, and cache on from off",
                 add_bf16_drift_args, "kvstrata.bench.bf16_drift:run_bf16_drift"),
    BenchCommand("radix-bookkeeping", "in-process: prefix-cache match/lock/hash/evict/insert time per request",
                 add_radix_bookkeeping_args, "kvstrata.bench.kv.radix_bookkeeping:run_radix_bookkeeping"),
    BenchCommand("synth-model", "write a random-weight GGUF of a real shape (Llama 3.2 1B/3B, Llama 3.1 8B, "
                 "Qwen2.5 7B) in a file type llama-quantize makes (Q4_K_M, Q8_0, ...)", add_synth_model_args,
                 "kvstrata.bench.synth.command:run_synth_model"),
    BenchCommand("spec", "the edit workload (files, JSON states and tool calls sent back changed): output tokens/s, "
                 "TPOT, chunk gaps and the server's accepted tokens per verify step", add_spec_args,
                 "kvstrata.bench.spec.command:run_spec"),
    BenchCommand("trace", "replay a Mooncake FAST'25 trace (hash-id blocks as token ids) live, or --simulate "
                 "the L1/L2/L3 cache over it at given capacities", add_trace_args, "kvstrata.bench.trace.command:run_trace"),
    BenchCommand("perplexity", "a text's perplexity on any OpenAI-compatible server (echo + logprobs), windows scored "
                 "as llama.cpp's llama-perplexity scores them; --llama-perplexity runs that tool beside it",
                 add_perplexity_args, "kvstrata.bench.perplexity.command:run_perplexity"),
)


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `bench` and its workload subcommands on the main CLI's subparsers."""
    bench = subparsers.add_parser("bench", help="benchmarks: load any OpenAI-compatible server, or time the engine")
    bench.set_defaults(func=run_bench)
    workloads = bench.add_subparsers(dest="bench_command", metavar="COMMAND", required=True)
    for command in BENCH_COMMANDS:
        command.add_arguments(workloads.add_parser(command.name, help=command.help, description=command.help))


def run_bench(args: argparse.Namespace) -> int:
    """Dispatch a parsed `bench <workload>` command; returns the exit code."""
    command = next(c for c in BENCH_COMMANDS if c.name == args.bench_command)
    module, function = command.run.split(":")
    return int(getattr(importlib.import_module(module), function)(args))
