"""The `trace` entry of `bench compare`'s workload registry (workloads.py).

`kvstrata bench compare --workload trace --trace FILE --engines kvstrata,vllm ...` replays the same
trace slice (trace/replay.py) against each engine in turn. Every engine runs its own default plan
for the CPU, as in every other workload: kvstrata `--dtype auto`, vLLM the dtype engines.py gives it
(`peer_dtype()`), llama.cpp its GGUF. The only extra flags size kvstrata's KV for a trace slice:
0.5 GB of L1 and an L2 of 5x that (SmolLM2 in bf16: ~21.7k tokens of L1 and ~108k of L2; half that
in float32), so a slice's working set fits L1+L2 in ~3 GB.
"""
from __future__ import annotations

import argparse
from typing import Any

from kvstrata.bench.compare.table import Column, CompareWorkload

SERVE_ARGS = {"kvstrata": ("--kv-cache-memory", "0.5", "--kvstore-ratio", "5")}
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
