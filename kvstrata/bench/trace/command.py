"""`kvstrata bench trace FILE`: replay a Mooncake trace live, or `--simulate` our cache stack over it.

    kvstrata bench trace trace.jsonl --url http://127.0.0.1:8000 --max-requests 200 --time-scale 0.2
    kvstrata bench trace trace.jsonl --simulate --capacities 70k,70k:280k,70k:280k:inf

The same live replay is `bench compare --workload trace --trace FILE` (compare/workloads.py).
Output: a table on stdout; `--output FILE.json` also writes FILE.md and FILE.png beside it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvstrata.bench.args import add_client_arguments
from kvstrata.bench.trace.format import (
    TRACE_BLOCK_SIZE, TraceError, TraceRequest, ideal_hit_rate, load_trace, select, unique_blocks,
)
from kvstrata.bench.trace.sim_store import UNBOUNDED, Capacity, parse_capacities

if TYPE_CHECKING:
    from kvstrata.bench.trace.tokens import BlockTokens

FIG9_TRACE_TOKENS = (3_000_000, 50_000_000)  # the Mooncake paper's Figure 9 marks
SWEEP = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)  # default L1 sizes, x the unique tokens


def add_trace_workload_args(parser: argparse.ArgumentParser, positional: bool = False) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("trace workload (Mooncake FAST'25 format)")
    if positional:
        group.add_argument("trace", metavar="FILE", help="JSONL trace: timestamp, input_length, output_length, hash_ids")
    else:
        group.add_argument("--trace", metavar="FILE", default=None, help="JSONL trace (Mooncake format)")
    group.add_argument("--trace-block-size", type=int, default=TRACE_BLOCK_SIZE,
                       help="tokens one hash id stands for in the trace (default: %(default)s)")
    group.add_argument("--block-tokens", type=int, default=16,
                       help="tokens sent per hash id: the trace's block scaled down (default: %(default)s)")
    group.add_argument("--start", type=int, default=0, help="first request of the slice, 0-based (default: 0)")
    group.add_argument("--max-requests", type=int, default=None, help="requests in the slice (default: all)")
    group.add_argument("--time-scale", type=float, default=1.0,
                       help="arrival times are divided by this: 2 = twice as fast (default: %(default)s)")
    group.add_argument("--max-output-tokens", type=int, default=32,
                       help="cap on each request's output_length (default: %(default)s)")
    group.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="goodput: TTFT SLO (default: %(default)s)")
    group.add_argument("--slo-tpot-ms", type=float, default=200.0, help="goodput: TPOT SLO (default: %(default)s)")
    return group


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    add_trace_workload_args(parser, positional=True)
    sim = parser.add_argument_group("simulation (no server, no model)")
    sim.add_argument("--simulate", action="store_true",
                     help="run the real radix cache, L2 host tier and L3 store eviction over the trace")
    sim.add_argument("--capacities", default=None,
                     help="comma-separated L1[:L2[:L3]] in tokens at --block-tokens (k, M, inf), e.g. "
                          "70k,70k:280k,70k:280k:inf (default: a sweep of L1 alone, 1%%-100%% of the unique tokens, "
                          "Figure 9's 3M and 50M trace tokens, and inf)")
    sim.add_argument("--partial-blocks", choices=("pad", "cut"), default="pad",
                     help="pad: every block a whole page, hits in trace tokens (reaches the ideal); cut: the live "
                          "prompts at --page-size (what a paged server reaches) (default: %(default)s)")
    parser.add_argument("--no-plots", action="store_true", help="with --output, skip the PNG")
    add_client_arguments(parser)


def check_trace_args(args: argparse.Namespace) -> list[TraceRequest]:
    """Load and slice the trace; ValueError (TraceError) naming the flag or the line."""
    if not args.trace:
        raise ValueError("--trace FILE is required for the trace workload")
    if args.time_scale <= 0:
        raise ValueError(f"--time-scale must be > 0 (got {args.time_scale})")
    if args.max_output_tokens < 1:
        raise ValueError(f"--max-output-tokens must be >= 1 (got {args.max_output_tokens})")
    if args.slo_ttft_ms <= 0 or args.slo_tpot_ms <= 0:
        raise ValueError("--slo-ttft-ms and --slo-tpot-ms must be > 0")
    if args.page_size < 1:
        raise ValueError(f"--page-size must be >= 1 (got {args.page_size})")
    mapping(args)  # --block-tokens range
    try:
        return select(load_trace(args.trace, args.trace_block_size), args.start, args.max_requests)
    except OSError as exc:
        raise ValueError(f"cannot read --trace {args.trace}: {exc.strerror or exc}") from None


def mapping(args: argparse.Namespace, model: bool = True) -> BlockTokens:
    """The id -> tokens mapping; with no model (`--simulate`) token ids may be any uint32, so even
    one token per block keeps every id distinct."""
    from kvstrata.bench.trace.tokens import TOKEN_HIGH, BlockTokens

    high = TOKEN_HIGH if model else 2**32
    return BlockTokens(args.block_tokens, args.seed, high=high, trace_block=args.trace_block_size)


def run_trace_replay(args: argparse.Namespace, url: str, requests: list[TraceRequest] | None = None) -> dict[str, Any]:
    """The live replay of the slice against `url`; the report (report.py)."""
    from kvstrata.bench.trace.replay import replay
    from kvstrata.bench.trace.report import summarize_replay
    from kvstrata.bench.trace.sim import scaled_ideal, simulate

    reqs = requests if requests is not None else check_trace_args(args)
    mp = mapping(args)
    page_ideal = simulate(reqs, mp, Capacity(UNBOUNDED), "cut", args.page_size).rate()
    rows, wall = asyncio.run(replay(url, args.model, reqs, mp, args.time_scale, args.max_output_tokens))
    meta = {"workload": "trace", "url": url, "model": args.model, "trace": str(args.trace), "start": args.start,
            "requests": len(reqs), "block_tokens": args.block_tokens, "trace_block_size": args.trace_block_size,
            "time_scale": args.time_scale, "max_output_tokens": args.max_output_tokens, "page_size": args.page_size,
            "first_line": reqs[0].line, "last_line": reqs[-1].line}
    return summarize_replay(rows, wall, scaled_ideal(reqs, mp), page_ideal, args.slo_ttft_ms, args.slo_tpot_ms, meta)


def default_capacities(requests: list[TraceRequest], mp: BlockTokens, floor: int) -> list[Capacity]:
    unique = unique_blocks(requests) * mp.block_tokens
    marks = [t * mp.block_tokens // mp.trace_block for t in FIG9_TRACE_TOKENS]
    sizes = {max(floor, int(f * unique) // mp.block_tokens * mp.block_tokens) for f in SWEEP} | set(marks)
    return [Capacity(float(s)) for s in sorted(s for s in sizes if s >= floor)] + [Capacity(UNBOUNDED)]


def run_simulation(args: argparse.Namespace, requests: list[TraceRequest]) -> dict[str, Any]:
    from kvstrata.bench.trace.report import sim_report
    from kvstrata.bench.trace.sim import min_l1_tokens, simulate

    mp = mapping(args, model=False)
    page = mp.block_tokens if args.partial_blocks == "pad" else args.page_size
    floor = min_l1_tokens(requests, mp, args.partial_blocks, page)
    caps = parse_capacities(args.capacities) if args.capacities else default_capacities(requests, mp, floor)
    small = [c.label() for c in caps if c.l1 < floor]
    if small:
        raise ValueError(f"--capacities {', '.join(small)}: L1 must hold the longest request, >= {floor} tokens")
    ideal = ideal_hit_rate(requests, args.trace_block_size)
    if args.partial_blocks == "cut":
        from kvstrata.bench.trace.sim import scaled_ideal

        ideal = scaled_ideal(requests, mp)
    results = []
    for cap in caps:
        res = simulate(requests, mp, cap, args.partial_blocks, page)
        print(f"  {cap.label():>20}  hit {res.rate():.4f}  ({res.seconds:.1f} s)", file=sys.stderr)
        results.append(res)
    blocks = unique_blocks(requests)
    meta = {"workload": "trace-simulation", "trace": str(args.trace), "start": args.start, "requests": len(requests),
            "block_tokens": mp.block_tokens, "trace_block_size": args.trace_block_size, "page_size": page,
            "partial_blocks": args.partial_blocks, "ideal_hit_rate": ideal, "unique_blocks": blocks,
            "unique_tokens": blocks * mp.block_tokens}
    return sim_report(results, meta)


def run_trace(args: argparse.Namespace) -> int:
    from kvstrata.bench.trace.report import replay_markdown, sim_markdown

    try:
        requests = check_trace_args(args)
        report = run_simulation(args, requests) if args.simulate else run_trace_replay(args, args.url, requests)
    except (ValueError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = sim_markdown(report) if args.simulate else replay_markdown(report)
    print(table)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        out.with_suffix(".md").write_text(table + "\n")
        if not args.no_plots:
            from kvstrata.bench.trace.plots import plot_sim, plot_trace

            png = out.with_suffix(".png")
            plot_sim(report, png) if args.simulate else plot_trace({"server": report}, png)
        print(f"wrote {out} (.md, .png)", file=sys.stderr)
    return 0 if args.simulate or not report["errors"] else 1
