"""The workloads `bench compare` can run, as a name -> `CompareWorkload` registry.

An entry says which flags the workload adds (its own; `--system-tokens` and the client flags are
shared and added once by command.py), how to run it against one engine's URL (`run(args, url)
-> report`, a JSON-ready dict with an `errors` count), its table columns, its plot, and any extra
`serve` flags per engine (kvstrata runs `repeat` with its response cache on; the peers have none,
which is the point). To add a workload, add one entry; command.py has no per-workload branches.
"""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kvstrata.bench.args import add_agentic_workload_args, check_client_arguments
from kvstrata.bench.compare.table import Column, CompareWorkload, Report, fmt, seconds
from kvstrata.bench.compare.trace_workload import trace_compare_workload
from kvstrata.bench.report import uncached_prompt_tokens_per_s

if TYPE_CHECKING:
    from kvstrata.bench.agentic.workload import AgenticConfig
    from kvstrata.bench.throughput.probe import ProbeConfig

RESPONSE_CACHE_SIZE = "1024"  # keys; the hot pool is 8 prompts, the unique ones come and go (LRU)


def _agentic_args(parser: argparse.ArgumentParser) -> object:
    return add_agentic_workload_args(parser)


def _agentic_config(args: argparse.Namespace) -> AgenticConfig:
    from kvstrata.bench.agentic.driver import agentic_config

    return agentic_config(args)


def _run_agentic(args: argparse.Namespace, url: str) -> Report:
    from kvstrata.bench.achievable import load_tokenizer
    from kvstrata.bench.agentic.driver import run_agentic_workload

    return run_agentic_workload(args, url, _agentic_config(args), load_tokenizer(args.tokenizer), progress=False)


def _multiround_args(parser: argparse.ArgumentParser) -> object:
    from kvstrata.bench.multiround.command import add_multiround_workload_args

    return add_multiround_workload_args(parser)


def _multiround_check(args: argparse.Namespace) -> object:
    from kvstrata.bench.multiround.command import multiround_config

    return multiround_config(args)


def _run_multiround(args: argparse.Namespace, url: str) -> Report:
    from kvstrata.bench.multiround.command import run_multiround_workload

    return run_multiround_workload(args, url)


def _repeat_args(parser: argparse.ArgumentParser) -> object:
    from kvstrata.bench.response_cache.repeat import add_repeat_workload_args

    return add_repeat_workload_args(parser)


def _repeat_check(args: argparse.Namespace) -> object:
    from kvstrata.bench.response_cache.repeat import repeat_requests

    check_client_arguments(args)
    return repeat_requests(args.num_requests, args.repeat_ratio, args.hot_prompts, args.seed)


def _run_repeat(args: argparse.Namespace, url: str) -> Report:
    from kvstrata.bench.response_cache.repeat import run_repeat_workload

    return run_repeat_workload(args, url)


def _run_throughput(args: argparse.Namespace, url: str) -> Report:
    from kvstrata.bench.throughput.probe import probe_throughput

    probe = probe_throughput(url, args.model, probe_config(args))
    meta = {"workload": "throughput", "url": url, "model": args.model}
    return {"meta": meta, "errors": probe["errors"], "throughput": probe}


def _throughput_check(args: argparse.Namespace) -> object:
    return probe_config(args).validate()


def serve_extra(name: str, args: argparse.Namespace) -> list[str]:
    """The `serve` flags compare adds for engine `name`: the workload's own for it, then for kvstrata's
    engines `--kvstrata-args` (a later flag wins)."""
    own = COMPARE_WORKLOADS[args.workload].serve_args.get(name, ())
    return [*own, *context_args(name, getattr(args, "context", 0)),
            *(shlex.split(args.kvstrata_args) if name.startswith("kvstrata") else [])]


def context_args(name: str, context: int) -> list[str]:
    """`--context N`: every engine serves N positions (a long cold prefill): kvstrata a pool of one such
    context, llama.cpp one slot of it (its 8 slots of 4,096 hold no longer prompt), vLLM its
    --max-model-len. 0: each engine's own defaults."""
    if context <= 0:
        return []
    if name.startswith("kvstrata"):
        return ["--max-model-len", str(context), "--max-total-tokens", str(context)]
    if name == "llamacpp":
        return ["-c", str(context), "-np", "1"]
    return ["--max-model-len", str(context)]


def probe_config(args: argparse.Namespace) -> ProbeConfig:
    from kvstrata.bench.throughput.probe import ProbeConfig

    return ProbeConfig(prefill_tokens=args.prefill_tokens, decode_tokens=args.decode_tokens,
                       decode_batch=args.decode_batch, repeats=args.probe_repeats, seed=args.seed,
                       context=getattr(args, "context", 0))


def add_probe_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("throughput probe (run after the workload on every engine)")
    group.add_argument("--no-throughput", action="store_true", help="skip the throughput probe")
    group.add_argument("--prefill-tokens", type=int, default=2048,
                       help="cold prefill prompt size in tokens (default: %(default)s)")
    group.add_argument("--context", type=int, default=0,
                       help="positions every engine serves, for a cold prefill past 3,800 tokens (llama.cpp then "
                       "runs one slot; default: each engine's own)")
    group.add_argument("--decode-tokens", type=int, default=128,
                       help="tokens each decode stream generates, ignore_eos (default: %(default)s)")
    group.add_argument("--decode-batch", type=int, default=8,
                       help="streams at once for the batched decode figure (default: %(default)s)")
    group.add_argument("--probe-repeats", type=int, default=2,
                       help="cold prefill prompts, one at a time; their mean is reported (default: %(default)s)")


def _edit_args(parser: argparse.ArgumentParser) -> object:
    from kvstrata.bench.spec.command import add_edit_workload_args

    return add_edit_workload_args(parser)


def _edit_check(args: argparse.Namespace) -> object:
    from kvstrata.bench.spec.command import edit_config

    return edit_config(args)


def _run_edit(args: argparse.Namespace, url: str) -> Report:
    from kvstrata.bench.spec.command import run_edit_workload

    return run_edit_workload(args, url)


def _describe_edit(report: Report) -> str:
    from kvstrata.bench.spec.command import format_edit

    return format_edit(report)


def _ms(section: str, *keys: str) -> Callable[[Report], str]:
    """The section's latencies (ms) joined with " / "."""
    return lambda r: " / ".join(fmt(r[section][f"{k}_ms"], "{:,.1f}") for k in keys)


def _describe_agentic(report: Report) -> str:
    from kvstrata.bench.report import format_table

    return format_table(report)


def _describe_multiround(report: Report) -> str:
    from kvstrata.bench.multiround.command import format_rounds

    return f"{_describe_agentic(report)}\n{format_rounds(report)}"


def _describe_repeat(report: Report) -> str:
    from kvstrata.bench.response_cache.repeat import format_repeat

    return format_repeat(report)


def _ttft_per_round(report: Report) -> str:
    return " · ".join(fmt(row["ttft_p50_s"], "{:.2f}") for row in report["per_round"])


def _cached(report: Report) -> str:
    return f"{fmt(report['cached_tokens'], '{:,}')} / {report['achievable_cached_tokens']:,}"


_HIT = Column("hit efficiency", lambda r: fmt(r["hit_efficiency"], "{:.3f}"))
_CACHED = Column("cached / achievable tokens", _cached)
_E2E = Column("e2e p50", lambda r: seconds(r["e2e_s"]["p50"]))
_OUT_TPS = Column("output tokens/s", lambda r: fmt(r["output_tokens_per_s"], "{:.1f}"))
_DURATION = Column("duration", lambda r: fmt(r["duration_s"], "{:.0f} s"))
_ERRORS = Column("errors", lambda r: str(r["errors"]))

COMPARE_WORKLOADS: dict[str, CompareWorkload] = {w.name: w for w in (
    CompareWorkload("agentic", _agentic_args, _run_agentic, _agentic_config, (
        _HIT, _CACHED,
        Column("TTFT first turn p50", lambda r: seconds(r["ttft_s"]["first_turn"]["p50"])),
        Column("TTFT later turns p50 / p90", lambda r: f"{seconds(r['ttft_s']['later_turns']['p50'])} / "
                                                       f"{seconds(r['ttft_s']['later_turns']['p90'])}"),
        _E2E, _OUT_TPS,
        Column("uncached prompt tokens/s", lambda r: fmt(uncached_prompt_tokens_per_s(r), "{:.0f}")),
        _DURATION, _ERRORS,
    ), _describe_agentic, plot="plot_agentic"),
    CompareWorkload("multiround", _multiround_args, _run_multiround, _multiround_check, (
        _HIT, _CACHED,
        Column("TTFT round 0 p50 / p99", lambda r: f"{seconds(r['ttft_s']['first_turn']['p50'])} / "
                                                   f"{seconds(r['ttft_s']['first_turn']['p99'])}"),
        Column("TTFT later rounds p50 / p99", lambda r: f"{seconds(r['ttft_s']['later_turns']['p50'])} / "
                                                        f"{seconds(r['ttft_s']['later_turns']['p99'])}"),
        Column("TTFT p50 by round (s)", _ttft_per_round),
        _E2E, _OUT_TPS, _DURATION, _ERRORS,
    ), _describe_multiround, plot="plot_multiround"),
    CompareWorkload("repeat", _repeat_args, _run_repeat, _repeat_check, (
        Column("requests", lambda r: str(r["requests"])),
        Column("latency mean / p50 / p99 ms", _ms("all", "mean", "p50", "p99")),
        Column("hot mean / p50 / p99 ms", _ms("hot", "mean", "p50", "p99")),
        Column("unique mean / p50 ms", _ms("unique", "mean", "p50")),
        Column("response-cache hits", lambda r: str(r["cache_header"].get("hit", 0))),
        Column("wall", lambda r: fmt(r["wall_s"], "{:.0f} s")), _ERRORS,
    ), _describe_repeat, plot="plot_repeat", serve_args={"kvstrata": ("--response-cache-size", RESPONSE_CACHE_SIZE)},
        needs_tokenizer=False),
    CompareWorkload("throughput", lambda parser: None, _run_throughput, _throughput_check, (), lambda r: "",
                    needs_tokenizer=False, probe_after=False),
    CompareWorkload("edit", _edit_args, _run_edit, _edit_check, (
        _OUT_TPS,
        Column("TPOT p50 / p99 ms", lambda r: f"{fmt(r['tpot_ms']['p50'], '{:.1f}')} / {fmt(r['tpot_ms']['p99'], '{:.1f}')}"),
        Column("chunk gap p50 / p99 ms", lambda r: f"{fmt(r['chunk_gap_ms']['p50'], '{:.1f}')} / "
                                                   f"{fmt(r['chunk_gap_ms']['p99'], '{:.1f}')}"),
        Column("accepted per verify step", lambda r: fmt(r["spec"]["mean_accepted_per_step"], "{:.2f}")),
        Column("TTFT p50", lambda r: seconds(r["ttft_s"]["p50"])), _ERRORS,
    ), _describe_edit, needs_tokenizer=False),
    trace_compare_workload(),
)}


def workload_plot(workload: CompareWorkload, results: dict[str, Report], out_dir: Path, stem: str) -> list[Path]:
    """The workload's PNG and, where any engine has probe figures, the throughput PNG."""
    from kvstrata.bench.compare import plots as compare_plots

    ok = {name: r for name, r in results.items() if "error" not in r}
    paths = []
    if workload.plot and ok:
        paths.append(getattr(compare_plots, workload.plot)(ok, out_dir / f"{stem}.png"))
    if any(r.get("throughput") for r in ok.values()):
        paths.append(compare_plots.plot_throughput(ok, out_dir / f"{stem}-throughput.png"))
    return paths
