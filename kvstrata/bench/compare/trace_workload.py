"""The `trace` entry of `bench compare`'s workload registry (workloads.py).

`kvstrata bench compare --workload trace --trace FILE --engines kvstrata,vllm ...` replays the same
trace slice (kvstrata/bench/trace/replay.py) against each engine in turn. Both serve float32 (on an AVX2-only
CPU bf16 matmuls are ~100x slower than float32); kvstrata gets 0.5 GB of L1 (~10.9k float32
SmolLM2 tokens) and an L2 of 5x that (~54k tokens), so a slice's working set fits L1+L2 in ~3 GB.
"""
from __future__ import annotations

import argparse
from typing import Any

from kvstrata.bench.compare.table import Column, CompareWorkload

SERVE_ARGS = {"kvstrata": ("--dtype", "float32", "--kv-cache-memory", "0.5", "--kvstore-ratio", "5"),
              "vllm": ("--dtype", "float32")}
_HEADERS = ("hit rate (achieved / ideal / page ideal)", "achieved / ideal", "TTFT p50 / p90 / p99", "TPOT p50 / p99",
            "goodput", "duration", "errors")


def _args(parser: argparse.ArgumentParser) -> object:
    from kvstrata.bench.trace.command import add_trace_workload_args

    return add_trace_workload_args(parser)


def _check(args: argparse.Namespace) -> object:
    from kvstrata.bench.trace.command import check_trace_args

    return check_trace_args(args)


def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    from kvstrata.bench.trace.command import run_trace_replay

    return run_trace_replay(args, url)


def _cell(i: int) -> Any:
    def cell(report: dict[str, Any]) -> str:
        from kvstrata.bench.trace.report import replay_cells

        return list(replay_cells(report).values())[i]

    return cell


def _describe(report: dict[str, Any]) -> str:
    from kvstrata.bench.trace.report import replay_markdown

    return replay_markdown(report)


def trace_compare_workload() -> CompareWorkload:
    columns = tuple(Column(h, _cell(i)) for i, h in enumerate(_HEADERS))
    return CompareWorkload("trace", _args, _run, _check, columns, _describe, plot="plot_trace",
                           serve_args=dict(SERVE_ARGS), needs_tokenizer=False)
