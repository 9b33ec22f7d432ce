"""`kvstrata bench spec`: the edit workload (workload.py) against any OpenAI-compatible server.

Sessions run `--concurrency` at a time (4; 1 = one agent waiting on each reply), each sending its turns
one after another (greedy, streamed). Reported: output
tokens/s (all completion tokens over the wall time), each request's time per output token after the
first (TPOT: its decode speed) p50/p99, the gaps between streamed chunks p50/p99 (a verify step streams
several tokens in one chunk), TTFT p50, and the server's mean accepted tokens per verify step where it
exposes them on /metrics (kvstrata's `spec_decode_*`, vLLM's `vllm:spec_decode_*`), per kind and in all.
`bench compare --workload edit` runs it against kvstrata with and without speculation and the peers.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict
from typing import Any

import httpx

from kvstrata.bench.args import add_client_arguments, check_client_arguments
from kvstrata.bench.client import ChatClient, ChatResult
from kvstrata.bench.report import percentile
from kvstrata.bench.spec.workload import KINDS, EditConfig, Turn, generate_edit

# a reply is the whole document sent back: by default its cap is the largest document (--doc-tokens MAX, a
# character estimate) plus a quarter for the tokenizer's own count and the edits, plus the fences
REPLY_SLACK_TOKENS = 128
# counters a server exposes for speculation: (drafted tokens, accepted tokens, verify steps or drafts)
SPEC_SERIES = {
    "kvstrata": ("kvstrata:spec_decode_draft_tokens_total", "kvstrata:spec_decode_accepted_tokens_total",
                 "kvstrata:spec_decode_acceptance_length_count"),
    "vllm": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
             "vllm:spec_decode_num_drafts_total"),
}


def add_edit_workload_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("edit workload")
    group.add_argument("--edit-sessions", type=int, default=6,
                       help="sessions at once; kinds rotate code, json, tool (default: %(default)s)")
    group.add_argument("--edit-turns", type=int, default=3, help="turns per session (default: %(default)s)")
    group.add_argument("--edit-max-tokens", type=int, default=None,
                       help="max_tokens of every reply (a document sent back; --max-tokens does not apply here) "
                            "(default: room for the largest document whole, 5/4 of --doc-tokens MAX + "
                            f"{REPLY_SLACK_TOKENS})")
    group.add_argument("--doc-tokens", default="300-1500",
                       help="document size range in tokens, MIN-MAX (default: %(default)s)")
    return group


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    add_edit_workload_args(parser)
    add_client_arguments(parser)


def edit_config(args: argparse.Namespace) -> EditConfig:
    m = re.fullmatch(r"(\d+)-(\d+)", str(args.doc_tokens))
    if not m:
        raise ValueError(f"--doc-tokens must be MIN-MAX, e.g. 300-1500 (got {args.doc_tokens!r})")
    config = EditConfig(sessions=args.edit_sessions, turns=args.edit_turns,
                        doc_tokens=(int(m.group(1)), int(m.group(2))), seed=args.seed)
    config.validate()
    if args.request_rate is not None:
        raise ValueError("--request-rate: the edit workload is closed-loop (sessions send each turn after the last "
                         "reply); use --concurrency")
    if args.edit_max_tokens is None:
        args.edit_max_tokens = reply_cap(config)
    if args.edit_max_tokens < 1:
        raise ValueError(f"--edit-max-tokens must be >= 1 (got {args.edit_max_tokens})")
    check_client_arguments(args)
    return config


def reply_cap(config: EditConfig) -> int:
    """The default max_tokens: room for the largest document sent back whole (a reply cut short measures
    the prompt's prefill more than the copy that speculation speeds up)."""
    return config.doc_tokens[1] * 5 // 4 + REPLY_SLACK_TOKENS


def scrape_spec(url: str) -> dict[str, float]:
    """The server's speculation counters now, {} when it exposes none."""
    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    values: dict[str, float] = {}
    for names in SPEC_SERIES.values():
        for name in names:
            for line in text.splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def spec_summary(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    for drafted_s, accepted_s, steps_s in SPEC_SERIES.values():
        if steps_s in after:
            d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (drafted_s, accepted_s, steps_s)}
            steps = d[steps_s]
            return {"drafted_tokens": d[drafted_s], "accepted_tokens": d[accepted_s],
                    "mean_accepted_per_step": d[accepted_s] / steps if steps else None,
                    "acceptance": d[accepted_s] / d[drafted_s] if d[drafted_s] else None}
    return {"drafted_tokens": None, "accepted_tokens": None, "mean_accepted_per_step": None, "acceptance": None}


def summarize(results: list[tuple[Turn, ChatResult]], wall_s: float) -> dict[str, Any]:
    ok = [(t, r) for t, r in results if r.ok]
    out_tokens = sum(r.completion_tokens or r.content_chunks for _, r in ok)
    tpot = [(r.e2e_s - r.ttft_s) / (r.completion_tokens - 1) for _, r in ok
            if r.ttft_s is not None and (r.completion_tokens or 0) > 1]
    gaps = [b - a for _, r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    ttft = [r.ttft_s for _, r in ok if r.ttft_s is not None]
    return {
        "requests": len(results), "errors": len(results) - len(ok), "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall_s if wall_s > 0 else None,
        "tpot_ms": {"p50": _ms(percentile(tpot, 50)), "p99": _ms(percentile(tpot, 99))},
        "chunk_gap_ms": {"p50": _ms(percentile(gaps, 50)), "p99": _ms(percentile(gaps, 99))},
        "ttft_s": {"p50": percentile(ttft, 50)},
        "tokens_per_chunk": out_tokens / max(1, sum(r.content_chunks for _, r in ok)),
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


async def _drive(url: str, model: str, max_tokens: int, sessions: list[list[Turn]],
                 concurrency: int) -> tuple[list[tuple[Turn, ChatResult]], float]:
    """Every session's turns in order, at most `concurrency` sessions at once."""
    results: list[tuple[Turn, ChatResult]] = []
    gate = asyncio.Semaphore(concurrency)
    async with ChatClient(url, model, max_tokens, max_connections=concurrency) as client:
        async def session(turns: list[Turn]) -> None:
            async with gate:
                for turn in turns:
                    results.append((turn, await client.chat(turn.messages)))

        t0 = time.perf_counter()
        await asyncio.gather(*(session(s) for s in sessions))
        return results, time.perf_counter() - t0


def run_edit_workload(args: argparse.Namespace, url: str) -> dict[str, Any]:
    config = edit_config(args)
    sessions = generate_edit(config)
    before = scrape_spec(url)
    results, wall = asyncio.run(_drive(url, args.model, args.edit_max_tokens, sessions, args.concurrency))
    report = {"meta": {"workload": "edit", "url": url, "model": args.model, "max_tokens": args.edit_max_tokens, "concurrency": args.concurrency,
                       **asdict(config)},
              **summarize(results, wall), "wall_s": wall, "spec": spec_summary(before, scrape_spec(url))}
    report["by_kind"] = {k: summarize([(t, r) for t, r in results if t.kind == k],
                                      wall) for k in KINDS if any(t.kind == k for t, _ in results)}
    return report


def format_edit(report: dict[str, Any]) -> str:
    def row(name: str, r: dict[str, Any]) -> str:
        f = lambda x, s="{:.1f}": "n/a" if x is None else s.format(x)  # noqa: E731
        return (f"| {name} | {r['requests']} | {r['output_tokens']} | {f(r['output_tokens_per_s'])} | "
                f"{f(r['tpot_ms']['p50'])} / {f(r['tpot_ms']['p99'])} | {f(r['chunk_gap_ms']['p50'])} / "
                f"{f(r['chunk_gap_ms']['p99'])} | {f(r['tokens_per_chunk'], '{:.2f}')} | {r['errors']} |")

    spec = report["spec"]
    lines = ["| kind | requests | output tokens | output tokens/s (all kinds share the wall) | TPOT p50 / p99 ms "
             "| chunk gap p50 / p99 ms | tokens a chunk | errors |", "|---|---|---|---|---|---|---|---|",
             row("all", report), *(row(k, r) for k, r in report["by_kind"].items())]
    mean = spec["mean_accepted_per_step"]
    lines.append(f"\nserver's speculation: drafted {spec['drafted_tokens']}, accepted {spec['accepted_tokens']}, "
                 f"mean accepted per verify step {'n/a' if mean is None else f'{mean:.2f}'}")
    return "\n".join(lines)


def run_spec(args: argparse.Namespace) -> int:
    try:
        edit_config(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run_edit_workload(args, args.url)
    print(format_edit(report))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report["errors"] else 0
